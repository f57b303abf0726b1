// Configure-time check (meson.build): does the compiler destroy a lambda
// temporary of a co_await expression once? g++ 12 destroys its captures
// twice (docs/runtime.md, "Compiler pitfalls"). Exit 0: right; 1: twice.
#include <coroutine>
#include <exception>
#include <utility>

namespace {

int alive = 0;

struct counted {
    counted() noexcept { ++alive; }
    counted(const counted&) noexcept { ++alive; }
    ~counted() { --alive; }
};

struct task {
    struct promise_type {
        task get_return_object() noexcept { return task{std::coroutine_handle<promise_type>::from_promise(*this)}; }
        std::suspend_always initial_suspend() noexcept { return {}; }
        std::suspend_always final_suspend() noexcept { return {}; }
        void return_void() noexcept {}
        void unhandled_exception() noexcept { std::terminate(); }
    };
    explicit task(std::coroutine_handle<promise_type> h) noexcept : handle(h) {}
    task(task&& other) noexcept : handle(std::exchange(other.handle, {})) {}
    ~task() {
        if (handle) handle.destroy();
    }
    std::coroutine_handle<promise_type> handle;
};

template <class F>
std::suspend_never take(const F&) noexcept {
    return {};
}

task awaiting() { co_await take([c = counted{}] { (void)c; }); }

}  // namespace

int main() {
    {
        task t = awaiting();
        t.handle.resume();
    }
    return alive == 0 ? 0 : 1;
}
