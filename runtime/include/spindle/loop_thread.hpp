#pragma once
/// A loop on a dedicated thread that this object starts and joins. Other
/// threads hand it work with post() and spawn(), both thread-safe. The loop is
/// built, run and destroyed on that thread; the constructor returns once it
/// exists, and rethrows what building it threw.

#include <spindle/loop.hpp>

#include <future>
#include <string>
#include <thread>

namespace spindle {

class loop_thread {
public:
    explicit loop_thread(loop_options options = {});
    /// Stops the loop, which destroys it (and so any task still parked in it)
    /// on its thread, and joins the thread.
    ~loop_thread();
    loop_thread(const loop_thread&) = delete;
    loop_thread& operator=(const loop_thread&) = delete;

    /// Use from other threads only through post() and spawn(). This, post()
    /// and spawn() are valid until join(): the loop is gone after it.
    loop& get() noexcept { return *m_loop; }

    template <class F>
    void post(F&& fn) {
        m_loop->post(std::forward<F>(fn));
    }

    /// Starts `t` on the loop's thread, detached.
    void spawn(task<void> t, std::string name = {}) {
        m_loop->post([l = m_loop, t = std::move(t), name = std::move(name)]() mutable {
            l->spawn(std::move(t), std::move(name)).detach();
        });
    }

    /// Stops the loop after its current tick, waits until its thread has
    /// destroyed it, and joins the thread. Idempotent.
    void join();

    std::thread::id thread_id() const noexcept { return m_thread.get_id(); }

private:
    loop* m_loop = nullptr;  // owned by m_thread
    std::promise<void> m_joining;
    std::thread m_thread;
};

}  // namespace spindle
