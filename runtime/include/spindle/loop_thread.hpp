#pragma once
/// A loop on a dedicated thread that this object starts and joins. Other
/// threads hand it work with post() and spawn(), both thread-safe.

#include <spindle/loop.hpp>

#include <memory>
#include <optional>
#include <string>
#include <thread>

namespace spindle {

class loop_thread {
public:
    explicit loop_thread(loop_options options = {});
    /// Stops the loop, joins the thread, then destroys the loop (and so any
    /// task still parked in it).
    ~loop_thread();
    loop_thread(const loop_thread&) = delete;
    loop_thread& operator=(const loop_thread&) = delete;

    /// Use from other threads only through post() and spawn().
    loop& get() noexcept { return *m_loop; }

    template <class F>
    void post(F&& fn) {
        m_loop->post(std::forward<F>(fn));
    }

    /// Starts `t` on the loop's thread, detached.
    void spawn(task<void> t, std::string name = {}) {
        m_loop->post([l = m_loop.get(), t = std::move(t), name = std::move(name)]() mutable {
            l->spawn(std::move(t), std::move(name)).detach();
        });
    }

    /// Stops the loop after its current tick and joins the thread. Idempotent.
    void join();

    std::thread::id thread_id() const noexcept { return m_thread.get_id(); }

private:
    std::unique_ptr<loop> m_loop;
    std::optional<loop::hold> m_hold;
    std::thread m_thread;
};

}  // namespace spindle
