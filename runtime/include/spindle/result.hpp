#pragma once
/// The one error style of spindle: operations that can fail for reasons of the
/// outside world (I/O, cancellation, timeouts) return a result carrying either
/// a value or a std::error_code. value() throws std::system_error on an error.

#include <cerrno>
#include <system_error>
#include <utility>

namespace spindle {

template <class T>
class [[nodiscard]] result {
public:
    result(T value) : m_value(std::move(value)) {}
    result(std::error_code error) : m_error(error) {}

    /// From a syscall-style value: negative means -errno.
    static result from_syscall(long long v) {
        if (v < 0) return std::error_code(static_cast<int>(-v), std::system_category());
        return T(v);
    }

    bool has_value() const noexcept { return !m_error; }
    explicit operator bool() const noexcept { return has_value(); }
    std::error_code error() const noexcept { return m_error; }

    T& value() & { check(); return m_value; }
    const T& value() const& { check(); return m_value; }
    T&& value() && { check(); return std::move(m_value); }
    T& operator*() & { return value(); }
    const T& operator*() const& { return value(); }
    T&& operator*() && { return std::move(*this).value(); }
    T* operator->() { check(); return &m_value; }
    const T* operator->() const { check(); return &m_value; }

private:
    void check() const {
        if (m_error) throw std::system_error(m_error);
    }
    T m_value{};
    std::error_code m_error{};
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
