// Internal: what node types are made of (Graph::type_of, src/core/graph_types.cpp) and the
// attribute text of their names, which the builders' messages use too.
#pragma once
#include <string>

#include "edbatch/op.h"

namespace edbatch {

// The shortest decimal that reads back as f ("0.1", "1e-05"): type names must tell apart every
// attribute that the key does.
std::string short_float(float f);

// Ops whose math depends on one float attribute (Node::alpha): it is part of the type.
bool alpha_attribute(Op op);

}  // namespace edbatch
