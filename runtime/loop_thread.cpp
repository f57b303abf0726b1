#include <spindle/loop_thread.hpp>

#include <exception>
#include <optional>

namespace spindle {

loop_thread::loop_thread(loop_options options) {
    // The loop is built, run and destroyed on its own thread: io_uring ties a
    // request to the thread that made it (its completion is that thread's
    // task work), so the wake-up that posts rely on must be armed there, not
    // on a thread that may then compute for milliseconds without entering the
    // kernel.
    std::promise<loop*> built;
    auto ready = built.get_future();
    m_thread = std::thread([options, built = std::move(built), joining = m_joining.get_future()]() mutable {
        std::optional<loop> l;
        try {
            l.emplace(options);
        } catch (...) {
            built.set_exception(std::current_exception());
            return;
        }
        {
            // The hold keeps run() going while the loop has nothing to do but
            // wait for posts; stop() ends it.
            loop::hold keep_running(*l);
            built.set_value(&*l);
            l->run();
        }
        // run() also returns when a task calls stop(); the loop must outlive
        // join()'s own stop() call all the same.
        joining.wait();
    });
    try {
        m_loop = ready.get();
    } catch (...) {
        m_thread.join();
        throw;
    }
}

loop_thread::~loop_thread() { join(); }

void loop_thread::join() {
    if (!m_thread.joinable()) return;
    m_loop->stop();
    m_joining.set_value();
    m_thread.join();
    m_loop = nullptr;
}

}  // namespace spindle
