#pragma once
/// The one error style of spindle: operations that can fail for reasons of the
/// outside world (I/O, cancellation, timeouts) return a result carrying either
/// a value or a std::error_code. value() throws std::system_error on an error.

#include <cerrno>
#include <memory>
#include <stdexcept>
#include <type_traits>
#include <system_error>
#include <utility>

namespace spindle {

template <class T>
class [[nodiscard]] result {
    static_assert(std::is_move_constructible_v<T>, "spindle::result<T> needs a move-constructible T");
    static_assert(!std::is_reference_v<T>, "spindle::result<T&>: use result<std::reference_wrapper<T>>");

public:
    result(T value) noexcept(std::is_nothrow_move_constructible_v<T>) : m_has_value(true) {
        std::construct_at(std::addressof(m_value), std::move(value));
    }
    /// An error; an empty error_code is a programming error (std::logic_error).
    result(std::error_code error) : m_error(error) {
        if (!error) throw std::logic_error("spindle::result: an error result needs a non-empty error_code");
    }
    result(const result& other)
        requires std::is_copy_constructible_v<T>
        : m_error(other.m_error), m_has_value(other.m_has_value) {
        if (m_has_value) std::construct_at(std::addressof(m_value), other.m_value);
    }
    result(result&& other) noexcept(std::is_nothrow_move_constructible_v<T>)
        : m_error(other.m_error), m_has_value(other.m_has_value) {
        if (m_has_value) std::construct_at(std::addressof(m_value), std::move(other.m_value));
    }
    result& operator=(const result& other)
        requires std::is_copy_constructible_v<T>
    {
        if (this != &other) assign(other);
        return *this;
    }
    result& operator=(result&& other) noexcept(std::is_nothrow_move_constructible_v<T>) {
        if (this != &other) assign(std::move(other));
        return *this;
    }
    ~result() { reset(); }

    /// From a syscall-style value: negative means -errno.
    static result from_syscall(long long v) {
        if (v < 0) return std::error_code(static_cast<int>(-v), std::system_category());
        return T(v);
    }

    bool has_value() const noexcept { return m_has_value; }
    explicit operator bool() const noexcept { return has_value(); }
    /// Empty when there is a value.
    std::error_code error() const noexcept { return m_error; }

    T& value() & { check(); return m_value; }
    const T& value() const& { check(); return m_value; }
    T&& value() && { check(); return std::move(m_value); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { check(); return std::addressof(m_value); }
    const T* operator->() const { check(); return std::addressof(m_value); }

private:
    void check() const {
        if (!m_has_value) throw std::system_error(m_error);
    }
    void reset() noexcept {
        if (m_has_value) std::destroy_at(std::addressof(m_value));
        m_has_value = false;
    }
    template <class R>
    void assign(R&& other) {
        reset();
        m_error = other.m_error;
        if (other.m_has_value) {
            std::construct_at(std::addressof(m_value), std::forward<R>(other).m_value);
            m_has_value = true;
        }
    }

    // No default construction of T: a result of a type without a default
    // constructor (a channel<T> receive) holds either a T or an error.
    union {
        T m_value;
    };
    std::error_code m_error{};
    bool m_has_value = false;
};

/// A result without a value: success, or an error.
template <>
class [[nodiscard]] result<void> {
public:
    result() noexcept = default;
    result(std::error_code error) noexcept : m_error(error) {}

    static result from_syscall(long long v) {
        if (v < 0) return std::error_code(static_cast<int>(-v), std::system_category());
        return {};
    }

    bool has_value() const noexcept { return !m_error; }
    explicit operator bool() const noexcept { return has_value(); }
    std::error_code error() const noexcept { return m_error; }
    void value() const {
        if (m_error) throw std::system_error(m_error);
    }

private:
    std::error_code m_error{};
};

/// The error a cancelled operation completes with.
inline std::error_code cancelled_error() noexcept {
    return std::make_error_code(std::errc::operation_canceled);
}

}  // namespace spindle
