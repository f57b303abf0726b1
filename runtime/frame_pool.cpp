#include <spindle/detail/frame_pool.hpp>

namespace spindle::detail {

frame_pool::~frame_pool() {
    // The thread is ending: give every cached block back.
    for (block*& head : m_free) {
        while (block* b = head) {
            head = b->next;
            ::operator delete(b);
        }
    }
}

}  // namespace spindle::detail
