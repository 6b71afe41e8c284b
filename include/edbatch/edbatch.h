// The public API in one include: graphs, blocks (compiled cells), bulk building from arrays,
// engines and their options, policies, optimizers and safetensors weights. (The model zoo and
// its data loaders: edbatch/zoo.h, edbatch/models.h, edbatch/data.h.)
#pragma once
#include "edbatch/backend.h"
#include "edbatch/block.h"
#include "edbatch/dim.h"
#include "edbatch/engine.h"
#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/op.h"
#include "edbatch/optim.h"
#include "edbatch/options.h"
#include "edbatch/packed.h"
#include "edbatch/params.h"
#include "edbatch/safetensors.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"
