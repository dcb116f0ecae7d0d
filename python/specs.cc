#include "python/specs.h"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/initializer.h"
#include "common/row_initializer.h"
#include "common/tensor_layout.h"
#include "google/protobuf/util/message_differencer.h"
#include "python/arrays.h"
#include "python/errors.h"
#include "store/optimizer.h"
#include "store/sparse_table.h"

namespace asyncps {
namespace python {
namespace {

const std::pair<const char*, Initializer> kInits[] = {
    {"zeros", INIT_ZEROS},
    {"constant", INIT_CONSTANT},
    {"uniform", INIT_UNIFORM},
    {"normal", INIT_NORMAL},
    {"glorot_uniform", INIT_GLOROT_UNIFORM},
    {"values", INIT_VALUES},
};
const std::pair<const char*, OptimizerType> kOptimizers[] = {
    {"sgd", OPT_SGD},
    {"momentum", OPT_MOMENTUM},
    {"adam", OPT_ADAM},
    {"adagrad", OPT_ADAGRAD},
};

template <typename Enum, size_t N>
Enum EnumFromName(const std::pair<const char*, Enum> (&table)[N],
                  const std::string& name, const char* what) {
  std::vector<std::string> names;
  for (const auto& [n, value] : table) {
    if (name == n) return value;
    names.push_back(absl::StrCat("'", n, "'"));
  }
  throw py::value_error(absl::StrCat(what, " must be one of ",
                                     absl::StrJoin(names, ", "), ", got '",
                                     name, "'"));
}

template <typename Enum, size_t N>
std::string EnumName(const std::pair<const char*, Enum> (&table)[N],
                     Enum value) {
  for (const auto& [n, v] : table) {
    if (v == value) return n;
  }
  return absl::StrCat(static_cast<int>(value));
}

// The optimizer fields of a TensorSpec or TableSpec, only those its type
// uses.
OptimizerSpec MakeOptimizer(const std::string& optimizer, double lr,
                            double momentum, double beta1, double beta2,
                            double epsilon, double initial_accumulator) {
  OptimizerSpec o;
  o.set_type(EnumFromName(kOptimizers, optimizer, "optimizer"));
  o.set_learning_rate(static_cast<float>(lr));
  if (o.type() == OPT_MOMENTUM) o.set_momentum(static_cast<float>(momentum));
  if (o.type() == OPT_ADAM) {
    o.set_beta1(static_cast<float>(beta1));
    o.set_beta2(static_cast<float>(beta2));
  }
  if (o.type() == OPT_ADAM || o.type() == OPT_ADAGRAD) {
    o.set_epsilon(static_cast<float>(epsilon));
  }
  if (o.type() == OPT_ADAGRAD) {
    o.set_initial_accumulator(static_cast<float>(initial_accumulator));
  }
  return o;
}

TensorSpec MakeSpec(const std::vector<int64_t>& shape, const std::string& name,
                    const std::string& init, double init_value, uint64_t seed,
                    const std::string& optimizer, double lr, double momentum,
                    double beta1, double beta2, double epsilon,
                    double initial_accumulator, int64_t slice_elems) {
  TensorSpec spec;
  spec.set_name(name);
  for (int64_t d : shape) spec.add_shape(d);
  spec.set_init(EnumFromName(kInits, init, "init"));
  spec.set_init_value(static_cast<float>(init_value));
  spec.set_seed(seed);
  *spec.mutable_optimizer() = MakeOptimizer(
      optimizer, lr, momentum, beta1, beta2, epsilon, initial_accumulator);
  spec.set_slice_elems(slice_elems);
  // The checks the shards apply, so that a bad spec never leaves here.
  CheckOk(TensorLayout::Create(shape, 1).status(), "TensorSpec shape");
  CheckOk(ValidateInitializer(spec), "TensorSpec");
  CheckOk(ValidateOptimizer(spec.optimizer()), "TensorSpec");
  if (slice_elems < 0) {
    throw py::value_error(absl::StrCat(
        "TensorSpec: slice_elems must be >= 0 (0 = the shards' default), got ",
        slice_elems));
  }
  return spec;
}

TableSpec MakeTableSpec(int32_t dim, const std::string& name,
                        const std::string& init, double init_value,
                        uint64_t seed, const std::string& optimizer, double lr,
                        double momentum, double beta1, double beta2,
                        double epsilon, double initial_accumulator) {
  TableSpec spec;
  spec.set_name(name);
  spec.set_dim(dim);
  spec.set_init(EnumFromName(kInits, init, "init"));
  spec.set_init_value(static_cast<float>(init_value));
  spec.set_seed(seed);
  *spec.mutable_optimizer() = MakeOptimizer(
      optimizer, lr, momentum, beta1, beta2, epsilon, initial_accumulator);
  // The checks the shards apply (the name is checked there).
  if (dim < 1 || dim > kMaxTableDim) {
    throw py::value_error(absl::StrCat("TableSpec: dim must be in [1, ",
                                       kMaxTableDim, "], got ", dim));
  }
  CheckOk(ValidateRowInitializer(spec), "TableSpec");
  CheckOk(ValidateOptimizer(spec.optimizer()), "TableSpec");
  return spec;
}

// The optimizer part of a spec's repr.
std::string OptimizerRepr(const OptimizerSpec& o) {
  std::string opt = absl::StrCat("optimizer='", EnumName(kOptimizers, o.type()),
                                 "', lr=", o.learning_rate());
  if (o.type() == OPT_MOMENTUM)
    absl::StrAppend(&opt, ", momentum=", o.momentum());
  if (o.type() == OPT_ADAM) {
    absl::StrAppend(&opt, ", beta1=", o.beta1(), ", beta2=", o.beta2(),
                    ", epsilon=", o.epsilon());
  }
  if (o.type() == OPT_ADAGRAD) {
    absl::StrAppend(&opt, ", epsilon=", o.epsilon(),
                    ", initial_accumulator=", o.initial_accumulator());
  }
  return opt;
}

std::string TableRepr(const TableSpec& s) {
  return absl::StrCat("TableSpec(name='", s.name(), "', dim=", s.dim(),
                      ", init='", EnumName(kInits, s.init()),
                      "', init_value=", s.init_value(), ", seed=", s.seed(),
                      ", ", OptimizerRepr(s.optimizer()), ")");
}

int64_t NumElems(const TensorSpec& spec) {
  int64_t n = 1;
  for (int64_t d : spec.shape()) n *= d;
  return n;
}

py::tuple ShapeOf(const TensorSpec& spec) {
  py::tuple t(spec.shape_size());
  for (int i = 0; i < spec.shape_size(); ++i) t[i] = spec.shape(i);
  return t;
}

std::string SpecRepr(const TensorSpec& s) {
  std::vector<std::string> dims;
  for (int64_t d : s.shape()) dims.push_back(absl::StrCat(d));
  const std::string opt = OptimizerRepr(s.optimizer());
  return absl::StrCat("TensorSpec(name='", s.name(), "', shape=(",
                      absl::StrJoin(dims, ", "), dims.size() == 1 ? ",)" : ")",
                      ", init='", EnumName(kInits, s.init()),
                      "', init_value=", s.init_value(), ", seed=", s.seed(),
                      ", ", opt, ", slice_elems=", s.slice_elems(), ")");
}

// The optimizer fields of a TensorSpec or TableSpec class as read-only
// properties, the same on both.
template <typename Spec>
void AddOptimizerProperties(py::class_<Spec>& c) {
  c.def_property_readonly("optimizer",
                          [](const Spec& s) {
                            return EnumName(kOptimizers, s.optimizer().type());
                          })
      .def_property_readonly(
          "lr", [](const Spec& s) { return s.optimizer().learning_rate(); })
      .def_property_readonly(
          "momentum", [](const Spec& s) { return s.optimizer().momentum(); })
      .def_property_readonly(
          "beta1", [](const Spec& s) { return s.optimizer().beta1(); })
      .def_property_readonly(
          "beta2", [](const Spec& s) { return s.optimizer().beta2(); })
      .def_property_readonly(
          "epsilon", [](const Spec& s) { return s.optimizer().epsilon(); })
      .def_property_readonly(
          "initial_accumulator",
          [](const Spec& s) { return s.optimizer().initial_accumulator(); })
      .def_property_readonly(
          "scheduled_lr",
          [](const Spec& s) { return s.optimizer().scheduled_learning_rate(); },
          "The rate in effect from schedule_step on (Client.set_lr); 0.0 "
          "when no schedule step was applied. Set in what list_tensors() "
          "returns.")
      .def_property_readonly(
          "schedule_step",
          [](const Spec& s) { return s.optimizer().schedule_step(); },
          "The schedule step of scheduled_lr; 0 when none.");
}

}  // namespace

void RegisterTensorSpec(py::module_& m) {
  py::class_<TensorSpec> tensor_spec(
      m, "TensorSpec",
      R"doc(How a tensor is created on the shards.

TensorSpec(shape, *, name='', init='zeros', init_value=0.0, seed=0,
           optimizer='sgd', lr=0.01, momentum=0.9, beta1=0.9,
           beta2=0.999, epsilon=1e-8, initial_accumulator=0.1,
           slice_elems=0)

shape        dimensions, each > 0.
init         'zeros', 'constant' (= init_value), 'uniform'
             (U(-init_value, init_value)), 'normal' (N(0, init_value^2)),
             'glorot_uniform'; seeded by `seed`. 'values': the values
             Client.create(..., values=) passes (a module's own).
optimizer    'sgd', 'momentum' (uses momentum), 'adam' (beta1, beta2,
             epsilon) or 'adagrad' (epsilon, initial_accumulator), run on
             the shards with learning rate `lr`.
slice_elems  elements per slice (0 = the shards' --slice_elems).
name         optional here; Client.create({name: spec}) names it.

Bad values raise ValueError at once. Creation is idempotent: the same spec
again is a no-op, a different one is RpcError ALREADY_EXISTS.)doc");
  tensor_spec
      .def(py::init(&MakeSpec), py::arg("shape"), py::kw_only(),
           py::arg("name") = "", py::arg("init") = "zeros",
           py::arg("init_value") = 0.0, py::arg("seed") = 0,
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01,
           py::arg("momentum") = 0.9, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8,
           py::arg("initial_accumulator") = 0.1, py::arg("slice_elems") = 0)
      .def_property_readonly("name", &TensorSpec::name)
      .def_property_readonly("shape", &ShapeOf)
      .def_property_readonly("num_elems", &NumElems)
      .def_property_readonly(
          "init",
          [](const TensorSpec& s) { return EnumName(kInits, s.init()); })
      .def_property_readonly("init_value", &TensorSpec::init_value)
      .def_property_readonly("seed", &TensorSpec::seed)
      .def_property_readonly("slice_elems", &TensorSpec::slice_elems)
      .def("__eq__",
           [](const TensorSpec& a, const py::object& b) {
             return py::isinstance<TensorSpec>(b) &&
                    google::protobuf::util::MessageDifferencer::Equals(
                        a, b.cast<TensorSpec>());
           })
      .def("__repr__", &SpecRepr);
  AddOptimizerProperties<TensorSpec>(tensor_spec);
}

void RegisterTableSpec(py::module_& m) {
  py::class_<TableSpec> table_spec(
      m, "TableSpec",
      R"doc(How a sparse embedding table is created on the shards.

TableSpec(dim, *, name='', init='zeros', init_value=0.0, seed=0,
          optimizer='sgd', lr=0.01, momentum=0.9, beta1=0.9, beta2=0.999,
          epsilon=1e-8, initial_accumulator=0.1)

dim          floats per row, 1..65536. Rows are created on first touch
             (a pull or push of their id) on the shard the id hashes to.
init         'zeros', 'constant', 'uniform' or 'normal' (as TensorSpec;
             no 'glorot_uniform': a table has no fan-in).
optimizer    as TensorSpec, applied per row to the rows a push touches
             ('adam' is lazy: moments per row).
name         optional here; Client.create_tables({name: spec}) names it.

Bad values raise ValueError at once.)doc");
  table_spec
      .def(py::init(&MakeTableSpec), py::arg("dim"), py::kw_only(),
           py::arg("name") = "", py::arg("init") = "zeros",
           py::arg("init_value") = 0.0, py::arg("seed") = 0,
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01,
           py::arg("momentum") = 0.9, py::arg("beta1") = 0.9,
           py::arg("beta2") = 0.999, py::arg("epsilon") = 1e-8,
           py::arg("initial_accumulator") = 0.1)
      .def_property_readonly("name", &TableSpec::name)
      .def_property_readonly("dim", &TableSpec::dim)
      .def_property_readonly(
          "init", [](const TableSpec& s) { return EnumName(kInits, s.init()); })
      .def_property_readonly("init_value", &TableSpec::init_value)
      .def_property_readonly("seed", &TableSpec::seed)
      .def("__eq__",
           [](const TableSpec& a, const py::object& b) {
             return py::isinstance<TableSpec>(b) &&
                    google::protobuf::util::MessageDifferencer::Equals(
                        a, b.cast<TableSpec>());
           })
      .def("__repr__", &TableRepr);
  AddOptimizerProperties<TableSpec>(table_spec);
}

template <typename Spec>
std::vector<Spec> SpecList(const py::object& specs, const char* method,
                           const char* type) {
  std::vector<Spec> list;
  std::vector<std::string> seen;
  auto add = [&](Spec spec) {
    if (spec.name().empty()) {
      throw py::value_error(absl::StrCat(method, ": a ", type, " has no name"));
    }
    for (const std::string& n : seen) {
      if (n == spec.name()) {
        throw py::value_error(absl::StrCat(method, ": '", n, "' given twice"));
      }
    }
    seen.push_back(spec.name());
    list.push_back(std::move(spec));
  };
  if (py::isinstance<py::dict>(specs)) {
    for (const auto& [key, value] : py::reinterpret_borrow<py::dict>(specs)) {
      const std::string name = KeyName(key, method);
      if (!py::isinstance<Spec>(value)) {
        throw py::type_error(absl::StrCat(method, ": the value for '", name,
                                          "' must be a ", type, ", got ",
                                          std::string(py::repr(value))));
      }
      Spec spec = value.template cast<Spec>();
      if (!spec.name().empty() && spec.name() != name) {
        throw py::value_error(absl::StrCat(method, ": key '", name,
                                           "' holds a ", type, " named '",
                                           spec.name(), "'"));
      }
      spec.set_name(name);
      add(std::move(spec));
    }
  } else if (py::isinstance<py::sequence>(specs) &&
             !py::isinstance<py::str>(specs)) {
    for (const py::handle& value : specs) {
      if (!py::isinstance<Spec>(value)) {
        throw py::type_error(absl::StrCat(method, ": expected ", type,
                                          " items, got ",
                                          std::string(py::repr(value))));
      }
      add(value.template cast<Spec>());
    }
  } else {
    throw py::type_error(absl::StrCat(method, ": expected {name: ", type,
                                      "} or a list of named ", type));
  }
  return list;
}

template std::vector<TensorSpec> SpecList<TensorSpec>(const py::object& specs,
                                                      const char* method,
                                                      const char* type);
template std::vector<TableSpec> SpecList<TableSpec>(const py::object& specs,
                                                    const char* method,
                                                    const char* type);

}  // namespace python
}  // namespace asyncps
