#pragma once
// How the runtime reaches the reactor's operation inside an io_op: placed in
// its opaque bytes by the io_op's constructor (io.cpp).

#include <spindle/detail/io_op.hpp>
#include <spindle/reactor/operation.hpp>

#include <new>

namespace spindle::detail {

struct io_access {
    static reactor::operation& op(io_op& o) noexcept { return *std::launder(reinterpret_cast<reactor::operation*>(o.m_backend)); }
    static const reactor::operation& op(const io_op& o) noexcept {
        return *std::launder(reinterpret_cast<const reactor::operation*>(o.m_backend));
    }
    static io_op& owner(reactor::operation& op) noexcept { return *static_cast<io_op*>(op.owner); }
    static void notify(io_op& o) noexcept { o.m_done(o); }
};

}  // namespace spindle::detail
