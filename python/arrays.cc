#include "python/arrays.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/payload.h"

namespace asyncps {
namespace python {

py::object ArrayView(const py::handle& obj, const std::string& what) {
  if (py::isinstance<py::array>(obj)) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  const py::handle type = py::type::handle_of(obj);
  const std::string module = py::str(type.attr("__module__"));
  if (module.rfind("torch", 0) != 0 || !py::hasattr(obj, "detach")) {
    return py::reinterpret_borrow<py::object>(obj);
  }
  const std::string device = py::str(obj.attr("device").attr("type"));
  if (device != "cpu") {
    throw py::type_error(absl::StrCat(what, " is a torch tensor on ", device,
                                      "; asyncps takes CPU memory"));
  }
  return obj.attr("detach")().attr("numpy")();
}

bool AllFiniteArray(const py::array& a) {
  return AllFinite(static_cast<const char*>(a.data()),
                   static_cast<size_t>(a.size()), WIRE_F32);
}

py::array CheckArray(const py::handle& original, const TensorSpec& spec,
                     bool writeable, const char* method) {
  const std::string& name = spec.name();
  // A numpy array as it is; anything else viewed (and named) only then.
  const py::object obj =
      py::isinstance<py::array>(original)
          ? py::reinterpret_borrow<py::object>(original)
          : ArrayView(original, absl::StrCat(method, ": tensor '", name, "'"));
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(absl::StrCat(
        method, ": tensor '", name,
        "' must be a numpy.ndarray or a CPU torch.Tensor, got ",
        std::string(py::str(py::type::handle_of(obj).attr("__name__")))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!py::isinstance<py::array_t<float>>(a)) {
    throw py::type_error(absl::StrCat(method, ": tensor '", name,
                                      "' must have dtype float32, got ",
                                      std::string(py::str(a.dtype()))));
  }
  bool same_shape = a.ndim() == spec.shape_size();
  for (int i = 0; same_shape && i < spec.shape_size(); ++i) {
    same_shape = a.shape(i) == spec.shape(i);
  }
  if (!same_shape) {
    std::vector<std::string> got, want;
    for (py::ssize_t i = 0; i < a.ndim(); ++i)
      got.push_back(absl::StrCat(a.shape(i)));
    for (int64_t d : spec.shape()) want.push_back(absl::StrCat(d));
    throw py::value_error(absl::StrCat(
        method, ": tensor '", name, "' has shape (", absl::StrJoin(got, ", "),
        ") but the cluster holds shape (", absl::StrJoin(want, ", "), ")"));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(
        absl::StrCat(method, ": tensor '", name,
                     "' is not C-contiguous (use numpy.ascontiguousarray)"));
  }
  if (writeable && !a.writeable()) {
    throw py::value_error(
        absl::StrCat(method, ": tensor '", name, "' is read-only"));
  }
  return a;
}

std::vector<std::string> NameList(const py::object& names, const char* method) {
  if (py::isinstance<py::str>(names)) return {names.cast<std::string>()};
  std::vector<std::string> out;
  if (!py::isinstance<py::sequence>(names)) {
    throw py::type_error(absl::StrCat(
        method, ": names must be a str or a list of str, got ",
        std::string(py::str(py::type::handle_of(names).attr("__name__")))));
  }
  for (const py::handle& n : names) {
    if (!py::isinstance<py::str>(n)) {
      throw py::type_error(absl::StrCat(method,
                                        ": tensor names must be str, got ",
                                        std::string(py::repr(n))));
    }
    out.push_back(n.cast<std::string>());
  }
  return out;
}

std::string KeyName(const py::handle& key, const char* method) {
  if (!py::isinstance<py::str>(key)) {
    throw py::type_error(absl::StrCat(method,
                                      ": tensor names must be str, got ",
                                      std::string(py::repr(key))));
  }
  return key.cast<std::string>();
}

void CheckDict(const py::handle& obj, const char* method) {
  if (!py::isinstance<py::dict>(obj)) {
    throw py::type_error(
        absl::StrCat(method, ": expected a dict {name: array}, got ",
                     std::string(py::repr(py::type::handle_of(obj)))));
  }
}

py::array_t<uint64_t> CheckIds(const py::handle& obj, const std::string& table,
                               const char* method) {
  py::array a = py::module_::import("numpy").attr("asarray")(obj);
  if (a.ndim() != 1) {
    throw py::value_error(absl::StrCat(method, ": ids of table '", table,
                                       "' must be 1-D, got ", a.ndim(),
                                       " dimensions"));
  }
  const char kind = a.dtype().kind();
  if (a.size() > 0 && kind != 'i' && kind != 'u') {
    throw py::type_error(absl::StrCat(method, ": ids of table '", table,
                                      "' must be integers, got dtype ",
                                      std::string(py::str(a.dtype()))));
  }
  if (kind == 'i' && a.size() > 0 && a.attr("min")().cast<int64_t>() < 0) {
    throw py::value_error(
        absl::StrCat(method, ": ids of table '", table, "' must be >= 0"));
  }
  return py::array_t<uint64_t, py::array::c_style | py::array::forcecast>(a);
}

py::array CheckRowGrads(const py::handle& original, const std::string& table,
                        py::ssize_t n, int32_t dim, const char* method,
                        const char* what) {
  const std::string whose =
      absl::StrCat(method, ": ", what, " of table '", table, "'");
  const py::object obj = ArrayView(original, whose);
  if (!py::isinstance<py::array>(obj)) {
    throw py::type_error(absl::StrCat(
        whose, " must be a numpy array or a CPU torch.Tensor, got ",
        std::string(py::repr(py::type::handle_of(obj)))));
  }
  py::array a = py::reinterpret_borrow<py::array>(obj);
  if (!a.dtype().is(py::dtype::of<float>()) ||
      !(a.flags() & py::array::c_style)) {
    throw py::type_error(absl::StrCat(whose,
                                      " must be C-contiguous float32, got "
                                      "dtype ",
                                      std::string(py::str(a.dtype()))));
  }
  if (a.ndim() != 2 || a.shape(0) != n || a.shape(1) != dim) {
    std::vector<std::string> dims;
    for (py::ssize_t i = 0; i < a.ndim(); ++i) {
      dims.push_back(absl::StrCat(a.shape(i)));
    }
    throw py::value_error(absl::StrCat(whose, " must have shape (", n, ", ",
                                       dim, "), got (",
                                       absl::StrJoin(dims, ", "), ")"));
  }
  return a;
}

}  // namespace python
}  // namespace asyncps
