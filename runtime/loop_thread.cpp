#include <spindle/loop_thread.hpp>

namespace spindle {

loop_thread::loop_thread(loop_options options) : m_loop(std::make_unique<loop>(options)) {
    // The hold keeps run() going while the loop has nothing to do but wait for posts.
    m_hold.emplace(*m_loop);
    m_thread = std::thread([l = m_loop.get()] { l->run(); });
}

loop_thread::~loop_thread() {
    join();
    m_hold.reset();
    m_loop.reset();
}

void loop_thread::join() {
    if (!m_thread.joinable()) return;
    m_loop->stop();
    m_thread.join();
}

}  // namespace spindle
