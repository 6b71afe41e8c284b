// The public API in one include.
#pragma once
#include "edbatch/backend.h"
#include "edbatch/dim.h"
#include "edbatch/engine.h"
#include "edbatch/fsm.h"
#include "edbatch/graph.h"
#include "edbatch/memplan.h"
#include "edbatch/op.h"
#include "edbatch/optim.h"
#include "edbatch/params.h"
#include "edbatch/schedule.h"
#include "edbatch/types.h"
