// Registration of tvm-rtask's PassContext config keys ("rtask.policy", ...) with TVM.
//
// TVM validates every key of `PassContext(config=...)` against a C++ registry filled by
// `tvm::transform::PassContext::RegisterConfigOption(const char* key, ffi::String
// value_type_str, std::function<ffi::Any(ffi::Any)> legalization)`, which has no Python
// binding.  The apache-tvm wheel ships no TVM headers and the build environment has no TVM,
// so this file does not link against TVM: it looks the (exported, mangled) function up at
// run time with dlsym and calls it through a function pointer of the same C++ type.  The
// types in that signature come from the tvm_ffi headers, which must be those of the
// tvm_ffi version TVM runs with (pinned: apache-tvm-ffi 0.1.14.post1); the version the
// library was compiled against is reported by tvm_rtask_pass_config_tvm_ffi_version() and
// checked by tvm_rtask/runtime/config.py before anything is registered.
//
// Value types follow TVM's own `PassContext::RegisterConfigOption<T>()` for non-object
// types: the registered type string is `ffi::TypeTraits<T>::TypeStr()` ("str", "int",
// "bool") and the legalization is `value.try_cast<T>()`, raising AttributeError when that
// fails.  So a Python str is kept as a string, and an int (or bool) is stored as an int.
//
// This library is separate from libtvm_rtask_runtime.so (plain C, linked by exported
// modules) and is loaded only after `import tvm`.  It references no libtvm_ffi symbol at
// link time beyond what the dynamic loader already finds in the process then.

#include <dlfcn.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/string.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#define RTASK_EXPORT extern "C" __attribute__((visibility("default")))

#ifndef TVM_RTASK_TVM_FFI_VERSION
#define TVM_RTASK_TVM_FFI_VERSION "unknown"
#endif

// Result codes of tvm_rtask_register_config_options (also in tvm_rtask/runtime/config.py).
enum : int {
  kRtaskCfgOk = 0,
  kRtaskCfgSymbolNotFound = 1,  // RegisterConfigOption not found in the process / library
  kRtaskCfgBadArgument = 2,     // null pointer, n < 0, or an unsupported type key
  kRtaskCfgTvmError = 3,        // TVM threw while registering (e.g. the key already exists)
};

namespace {

using Any = tvm::ffi::Any;
using String = tvm::ffi::String;
using Legalization = std::function<Any(Any)>;
using RegisterFn = void (*)(const char*, String, Legalization);

// tvm::transform::PassContext::RegisterConfigOption(char const*, tvm::ffi::String,
//     std::function<tvm::ffi::Any (tvm::ffi::Any)>)
constexpr const char* kRegisterSymbol =
    "_ZN3tvm9transform11PassContext20RegisterConfigOptionEPKcNS_3ffi6StringESt8functionIFNS4_"
    "3AnyES7_EE";

std::mutex g_mutex;
std::string g_last_error;  // guarded by g_mutex

void SetError(std::string msg) { g_last_error = std::move(msg); }

// Find RegisterConfigOption: in the library `lib_path` when given (it must already be
// loaded: RTLD_NOLOAD), otherwise in the global symbol scope of the process.  TVM's Python
// package loads libtvm_compiler.so RTLD_LOCAL, so the global scope usually lacks it.
RegisterFn FindRegister(const char* lib_path) {
  void* sym = nullptr;
  if (lib_path != nullptr && lib_path[0] != '\0') {
    void* handle = dlopen(lib_path, RTLD_NOW | RTLD_NOLOAD);
    if (handle == nullptr) {
      const char* err = dlerror();
      SetError(std::string("library not loaded in this process: ") + lib_path + " (" +
               (err ? err : "dlopen failed") + ")");
      return nullptr;
    }
    dlerror();
    sym = dlsym(handle, kRegisterSymbol);
    // Drop the reference RTLD_NOLOAD added; the library stays loaded by TVM.
    dlclose(handle);
    if (sym == nullptr) {
      SetError(std::string("symbol tvm::transform::PassContext::RegisterConfigOption not found "
                           "in ") +
               lib_path);
    }
  } else {
    dlerror();
    sym = dlsym(RTLD_DEFAULT, kRegisterSymbol);
    if (sym == nullptr) {
      SetError(
          "symbol tvm::transform::PassContext::RegisterConfigOption not found in the global "
          "symbol scope (pass the path of libtvm_compiler.so)");
    }
  }
  return reinterpret_cast<RegisterFn>(sym);
}

[[noreturn]] void ThrowTypeError(const std::string& key, const char* type_str,
                                 const Any& value) {
  throw tvm::ffi::Error("AttributeError",
                        "Expect config " + key + " to have type " + type_str +
                            ", but instead get " + value.GetTypeKey(),
                        "");
}

// Same checks as TVM's RegisterConfigOption<T>() for non-object T.
template <typename T>
Legalization MakeLegalization(std::string key, const char* type_str) {
  return [key = std::move(key), type_str](Any value) -> Any {
    std::optional<T> v = value.try_cast<T>();
    if (!v.has_value()) ThrowTypeError(key, type_str, value);
    return Any(*std::move(v));
  };
}

std::optional<Legalization> LegalizationFor(const char* key, const char* type_key) {
  if (std::strcmp(type_key, "str") == 0) return MakeLegalization<String>(key, "str");
  if (std::strcmp(type_key, "int") == 0) return MakeLegalization<int64_t>(key, "int");
  if (std::strcmp(type_key, "bool") == 0) return MakeLegalization<bool>(key, "bool");
  return std::nullopt;
}

}  // namespace

// Register `n` config keys with TVM.  keys[i] is the key ("rtask.policy"), type_keys[i] one
// of "str", "int", "bool".  tvm_compiler_lib: path of the already loaded libtvm_compiler.so
// that defines RegisterConfigOption, or NULL to search the global symbol scope.  Registering
// an existing key is an error in TVM (kRtaskCfgTvmError): callers skip keys that
// `tvm.transform.PassContext.list_configs()` already has.  Keys are registered in order; on
// error the earlier ones stay registered.  Not to be called while other threads create
// PassContexts (TVM's registry has no lock).
RTASK_EXPORT int tvm_rtask_register_config_options(const char** keys, const char** type_keys,
                                                   int n, const char* tvm_compiler_lib) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_error.clear();
  if (n < 0 || (n > 0 && (keys == nullptr || type_keys == nullptr))) {
    SetError("bad arguments: null key arrays or negative count");
    return kRtaskCfgBadArgument;
  }
  // Validate everything before registering anything.
  for (int i = 0; i < n; ++i) {
    if (keys[i] == nullptr || type_keys[i] == nullptr || keys[i][0] == '\0') {
      SetError("bad arguments: null or empty key / type key at index " + std::to_string(i));
      return kRtaskCfgBadArgument;
    }
    if (!LegalizationFor(keys[i], type_keys[i]).has_value()) {
      SetError(std::string("unsupported value type '") + type_keys[i] + "' for config key '" +
               keys[i] + "' (supported: str, int, bool)");
      return kRtaskCfgBadArgument;
    }
  }
  RegisterFn reg = FindRegister(tvm_compiler_lib);
  if (reg == nullptr) return kRtaskCfgSymbolNotFound;
  for (int i = 0; i < n; ++i) {
    try {
      reg(keys[i], String(type_keys[i]), *LegalizationFor(keys[i], type_keys[i]));
    } catch (const std::exception& e) {
      SetError(std::string("registering '") + keys[i] + "' failed: " + e.what());
      return kRtaskCfgTvmError;
    } catch (...) {
      SetError(std::string("registering '") + keys[i] + "' failed: unknown C++ exception");
      return kRtaskCfgTvmError;
    }
  }
  return kRtaskCfgOk;
}

// 1 if RegisterConfigOption can be found (same lookup as above), 0 otherwise.
RTASK_EXPORT int tvm_rtask_pass_config_available(const char* tvm_compiler_lib) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_last_error.clear();
  return FindRegister(tvm_compiler_lib) != nullptr ? 1 : 0;
}

// Message of the last failure of the functions above ("" after a success).  The pointer is
// valid until the next call of any of them.
RTASK_EXPORT const char* tvm_rtask_pass_config_last_error(void) { return g_last_error.c_str(); }

// Version of the tvm_ffi headers this library was compiled against.
RTASK_EXPORT const char* tvm_rtask_pass_config_tvm_ffi_version(void) {
  return TVM_RTASK_TVM_FFI_VERSION;
}
