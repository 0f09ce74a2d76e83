// The C entries' error messages: a prefix naming the entry, then the printf-style detail, in
// the caller's buffer.
#pragma once
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

namespace nattn { namespace host {

// Writes `prefix` and the detail into err (err_len bytes; nothing when err is null or
// err_len <= 0) and returns code.
inline int write_error(char* err, int64_t err_len, int code, const char* prefix, const char* fmt, va_list ap) {
  if (!err || err_len <= 0) return code;
  const int used = snprintf(err, size_t(err_len), "%s", prefix);
  if (used >= 0 && used < err_len) vsnprintf(err + used, size_t(err_len - used), fmt, ap);
  return code;
}

}  }  // namespace nattn::host
