// Internal: what node types are made of (Graph::type_of, src/core/graph_types.cpp), the
// attribute text of their names, which the builders' messages use too, and helpers the
// builders share.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>
#include <vector>

#include "edbatch/op.h"

namespace edbatch {

// The shortest decimal that reads back as f ("0.1", "1e-05"): type names must tell apart every
// attribute that the key does.
std::string short_float(float f);

// Ops whose math depends on one float attribute (Node::alpha): it is part of the type.
bool alpha_attribute(Op op);

// Throws std::invalid_argument("[fn] msg"): the form of every graph builder's error.
[[noreturn]] void graph_fail(const char* fn, const std::string& msg);

// Room for `more` elements, growing the capacity at least twofold: bulk builders reserve ahead
// without making repeated small additions quadratic.
template <class T>
void reserve_geometric(std::vector<T>& v, size_t more) {
  if (v.size() + more > v.capacity()) v.reserve(std::max(v.size() + more, 2 * v.capacity()));
}

}  // namespace edbatch
