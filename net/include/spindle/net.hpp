#pragma once
/// spindle's network layer in one include.

#include <spindle/net/address.hpp>
#include <spindle/net/buffered_reader.hpp>
#include <spindle/net/byte_stream.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/resolve.hpp>
#include <spindle/net/send_file.hpp>
#include <spindle/net/shared_listener.hpp>
#include <spindle/net/tcp.hpp>
#include <spindle/net/udp.hpp>
#include <spindle/net/unix.hpp>
#include <spindle/net/write.hpp>
