#pragma once
/// spindle's TLS layer in one include (docs/tls.md): contexts and encrypted
/// streams over any byte stream, through OpenSSL 3.

#include <spindle/tls/context.hpp>
#include <spindle/tls/error.hpp>
#include <spindle/tls/stream.hpp>
