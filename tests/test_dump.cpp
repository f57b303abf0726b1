// loop::tasks() and loop::dump_tasks(): what each task waits on (sleep, I/O,
// signal, mutex, channel, event, join, task group, race, idle), the names
// given to spawn, ready and running tasks, and how long each has been parked.
// Under virtual time the clock does not move while tasks run, so the dump's
// numbers are exact.
#define CATCH_CONFIG_ENABLE_PAIR_STRINGMAKER  // print the (what, when) pairs compared below
#include "support.hpp"

#include <spindle/channel.hpp>
#include <spindle/event.hpp>
#include <spindle/mutex.hpp>
#include <spindle/task_group.hpp>
#include <spindle/testing.hpp>
#include <spindle/race.hpp>

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace std::chrono_literals;
using spindle::join_handle;
using spindle::loop;
using spindle::task;
using spindle::task_info;
using spindle::test::pipe_pair;
using spindle::test::run;
namespace testing = spindle::testing;

namespace {

using state = task_info::state_kind;

using spindle::test::socket_pair;

/// A task as a line that is easy to compare: "name: state / waiting on".
std::string line(const task_info& t) {
    std::string s = t.name.empty() ? "(unnamed)" : t.name;
    switch (t.state) {
        case state::running: return s + ": running";
        case state::ready: return s + ": ready";
        case state::parked: return s + ": " + t.waiting_on;
    }
    return s;
}

std::vector<std::string> lines(const std::vector<task_info>& all) {
    std::vector<std::string> out;
    for (const auto& t : all) out.push_back(line(t));
    return out;
}

const task_info* find(const std::vector<task_info>& all, const std::string& name) {
    for (const auto& t : all)
        if (t.name == name) return &t;
    return nullptr;
}

task<void> sleep_for_long(std::chrono::nanoseconds d) { (void)co_await spindle::sleep_for(d); }

task<void> recv_one(int fd) {
    std::byte b{};
    (void)co_await spindle::recv(fd, std::span(&b, 1));
}

task<void> read_one(int fd) {
    std::byte b{};
    (void)co_await spindle::read(fd, std::span(&b, 1));
}

task<void> wait_for_signal(int signo) { (void)co_await spindle::wait_signal(signo); }

task<void> lock_it(spindle::mutex& m) { (void)co_await m.lock(); }

task<void> receive_one(spindle::channel<int>& ch) { (void)co_await ch.receive(); }

task<void> send_one(spindle::channel<int>& ch) { (void)co_await ch.send(2); }

task<void> wait_for(spindle::event& ev) { (void)co_await ev.wait(); }

task<void> join_it(join_handle<void>& h) {
    try {
        co_await h;
    } catch (const std::system_error&) {
    }
}

task<void> idle_once() { (void)co_await spindle::idle(); }

task<void> race_two(spindle::event& ev) { (void)co_await spindle::race(sleep_for_long(20s), wait_for(ev)); }

task<void> group_of_two() {
    spindle::task_group g;
    g.spawn(sleep_for_long(30s), "group child");
    g.spawn(sleep_for_long(40s), "group child");
    co_await g.join();
}

task<void> nothing() { co_return; }

struct snapshot {
    std::vector<task_info> tasks;
    std::string text;
    std::vector<std::string> after_set;
};

// Every kind of wait at once, seen from the task that asks (which is running).
task<snapshot> every_wait(int sock, int signo) {
    loop& l = loop::current();
    spindle::mutex m;
    REQUIRE(m.try_lock());
    spindle::channel<int> empty(1);
    spindle::channel<int> full(1);
    REQUIRE(!full.try_send(1).error());
    spindle::event ev;
    spindle::event never;

    std::vector<join_handle<void>> hs;
    hs.reserve(16);  // the joiner refers to the first handle
    hs.push_back(l.spawn(sleep_for_long(10s), "sleeper"));  // task 2
    hs.push_back(l.spawn(recv_one(sock), "reader"));
    hs.push_back(l.spawn(wait_for_signal(signo), "signal"));
    hs.push_back(l.spawn(lock_it(m), "locker"));
    hs.push_back(l.spawn(receive_one(empty), "receiver"));
    hs.push_back(l.spawn(send_one(full), "sender"));
    hs.push_back(l.spawn(wait_for(ev), "waiter"));
    hs.push_back(l.spawn(join_it(hs[0]), "joiner"));
    hs.push_back(l.spawn(idle_once(), "idler"));
    hs.push_back(l.spawn(race_two(never), "racer"));       // its children: tasks 14 and 15
    hs.push_back(l.spawn(group_of_two(), "grouper"));  // its children: tasks 16 and 17
    hs.push_back(l.spawn(sleep_for_long(1h)));         // task 13, with no name
    // Yielding keeps a task ready, so the idler is not woken, nor the clock moved.
    for (int i = 0; i < 4; ++i) co_await spindle::yield();
    hs.push_back(l.spawn(nothing(), "fresh"));  // not started yet: ready

    snapshot snap;
    snap.tasks = l.tasks();
    snap.text = l.dump_tasks();

    // A task woken but not resumed yet is ready, no longer parked.
    ev.set();
    snap.after_set = lines(l.tasks());

    // Wind everything down, so the run finds no leak.
    m.unlock();
    (void)empty.try_send(3);
    (void)full.try_receive();
    for (auto& h : hs) h.cancel();
    // Last first: the joiner must be done before the sleeper's handle is
    // awaited here (a task is joined by one awaiter at a time). The idler
    // resumes once the loop has nothing else to do.
    for (auto it = hs.rbegin(); it != hs.rend(); ++it) co_await *it;
    co_return snap;
}

TEST_CASE("dump: every kind of wait, names, ready and running tasks", "[dump]") {
    socket_pair s;
    const snapshot snap = testing::run(every_wait(s.a, SIGUSR2));
    const std::string sig = std::to_string(SIGUSR2);
    const std::vector<std::string> expected{
        "block_on: running",
        "sleeper: sleep, due in 10000 ms",
        "reader: recv on fd " + std::to_string(s.a),
        "signal: signal " + sig,
        "locker: mutex lock",
        "receiver: channel receive (empty)",
        "sender: channel send (full)",
        "waiter: event",
        "joiner: join of task 2 (sleeper)",
        "idler: idle",
        "racer: race of 2 tasks",
        "grouper: join of a task group of 2",
        "(unnamed): sleep, due in 3600000 ms",
        "race: sleep, due in 20000 ms",
        "race: event",
        "group child: sleep, due in 30000 ms",
        "group child: sleep, due in 40000 ms",
        "fresh: ready",
    };
    CHECK(lines(snap.tasks) == expected);

    // Ids in spawn order; nothing has been parked for any time: the clock stood still.
    REQUIRE(snap.tasks.size() == 18);
    std::vector<std::uint64_t> ids;
    for (const auto& t : snap.tasks) {
        ids.push_back(t.id);
        CHECK(t.parked_for == 0ns);
    }
    CHECK(ids == std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18});

    // The text: a count, then one line per task.
    CHECK(snap.text.rfind("18 tasks\n  task 1 'block_on': running\n  task 2 'sleeper': waiting on sleep, due in 10000 ms for 0 ms\n", 0) == 0);
    CHECK(snap.text.find("  task 9 'joiner': waiting on join of task 2 (sleeper) for 0 ms\n") != std::string::npos);
    CHECK(snap.text.find("  task 13: waiting on sleep, due in 3600000 ms for 0 ms\n") != std::string::npos);
    CHECK(snap.text.find("  task 18 'fresh': ready\n") != std::string::npos);

    CHECK(snap.after_set[7] == "waiter: ready");
    CHECK(snap.after_set[14] == "race: event");  // a different event, still waited on
}

task<std::vector<std::pair<std::string, std::chrono::nanoseconds>>> parked_times(int fd, std::chrono::nanoseconds step) {
    loop& l = loop::current();
    auto reader = l.spawn(read_one(fd), "reader");
    co_await spindle::yield();  // it parks
    std::vector<std::pair<std::string, std::chrono::nanoseconds>> out;
    for (int i = 0; i < 3; ++i) {
        const auto all = l.tasks();
        const task_info* t = find(all, "reader");
        out.emplace_back(t ? t->waiting_on : "gone", t ? t->parked_for : -1ns);
        (void)co_await spindle::sleep_for(step);
    }
    reader.cancel();
    co_await reader;
    co_return out;
}

TEST_CASE("dump: parked_for grows with the time a task has been parked", "[dump]") {
    pipe_pair p;

    SECTION("real time: at least the time slept in between, loosely") {
        loop l;
        auto r = run(l, parked_times(p.r, 60ms));
        REQUIRE(r.size() == 3);
        for (const auto& [what, _] : r) CHECK(what == "read on fd " + std::to_string(p.r));
        CHECK(r[0].second >= 0ns);
        CHECK(r[0].second < 60ms);
        CHECK(r[1].second >= 50ms);
        CHECK(r[2].second >= r[1].second + 50ms);
    }
    SECTION("virtual time: exactly the time that passed") {
        auto r = testing::run(parked_times(p.r, 1h));
        const std::string what = "read on fd " + std::to_string(p.r);
        const std::vector<std::pair<std::string, std::chrono::nanoseconds>> expected{
            {what, 0h}, {what, 1h}, {what, 2h}};
        CHECK(r == expected);
    }
}

task<void> holder(spindle::event& release) { (void)co_await release.wait(); }

/// Whatever the program writes to stdout and stderr while alive goes to a
/// pipe instead; text() gives it back.
class output_capture {
public:
    output_capture() {
        REQUIRE(::pipe2(m_pipe, O_NONBLOCK | O_CLOEXEC) == 0);
        std::fflush(stdout);
        std::fflush(stderr);
        m_saved_out = ::dup(1);
        m_saved_err = ::dup(2);
        REQUIRE((m_saved_out >= 0 && m_saved_err >= 0));
        REQUIRE(::dup2(m_pipe[1], 1) == 1);
        REQUIRE(::dup2(m_pipe[1], 2) == 2);
    }
    ~output_capture() {
        restore();
        ::close(m_pipe[0]);
    }
    output_capture(const output_capture&) = delete;
    output_capture& operator=(const output_capture&) = delete;

    std::string text() {
        restore();
        std::string out;
        char buf[256];
        for (ssize_t n; (n = ::read(m_pipe[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
        return out;
    }

private:
    void restore() {
        if (m_saved_out < 0) return;
        std::fflush(stdout);
        std::fflush(stderr);
        ::dup2(m_saved_out, 1);
        ::dup2(m_saved_err, 2);
        ::close(m_saved_out);
        ::close(m_saved_err);
        ::close(m_pipe[1]);
        m_saved_out = m_saved_err = -1;
    }

    int m_pipe[2] = {-1, -1};
    int m_saved_out = -1;
    int m_saved_err = -1;
};

TEST_CASE("dump: dump_tasks() gives the text and prints nothing itself", "[dump]") {
    loop l;
    spindle::event ev;
    auto h = l.spawn(holder(ev), "holder");
    l.run_once(0ns);
    std::string dump;
    std::string printed;
    {
        output_capture capture;
        dump = l.dump_tasks();
        printed = capture.text();
    }
    CHECK(dump.rfind("1 task\n  task 1 'holder': waiting on event for ", 0) == 0);
    CHECK(printed.empty());
    ev.set();
    l.run();
}

TEST_CASE("dump: seen from outside any task, nothing is running; the text counts one task in the singular", "[dump]") {
    loop l;
    spindle::event ev;
    CHECK(l.tasks().empty());
    CHECK(l.dump_tasks() == "0 tasks\n");
    auto h = l.spawn(holder(ev), "holder");
    CHECK(l.dump_tasks() == "1 task\n  task 1 'holder': ready\n");
    l.run_once(0ns);
    const auto all = l.tasks();
    REQUIRE(all.size() == 1);
    CHECK(all[0].id == 1);
    CHECK(all[0].name == "holder");
    CHECK(all[0].state == state::parked);
    CHECK(all[0].waiting_on == "event");
    CHECK(l.dump_tasks().rfind("1 task\n  task 1 'holder': waiting on event for ", 0) == 0);
    ev.set();
    CHECK(lines(l.tasks()) == std::vector<std::string>{"holder: ready"});
    REQUIRE(run(l, [](join_handle<void>& h) -> task<bool> {
        co_await h;
        co_return true;
    }(h)));
    CHECK(l.tasks().empty());
}

}  // namespace

TEST_CASE("dump: a task's name is held only while its task's header lives", "[dump]") {
    // Names live in a table of the process, not in the header: each must
    // go when its header goes, or the table would grow with every named task.
    const std::size_t before = spindle::detail::task_names_held();
    {
        loop l;
        std::vector<spindle::join_handle<void>> handles;
        for (int i = 0; i < 100; ++i)
            handles.push_back(l.spawn(sleep_for_long(0ns), "named " + std::to_string(i)));
        (void)l.spawn(sleep_for_long(0ns));  // unnamed: holds nothing
        CHECK(spindle::detail::task_names_held() == before + 100);
        const std::vector<task_info> all = l.tasks();
        CHECK(find(all, "named 0") != nullptr);
        CHECK(find(all, "named 99") != nullptr);
        l.run();
        // Finished, and their handles still hold the headers.
        CHECK(spindle::detail::task_names_held() == before + 100);
        handles.clear();
        CHECK(spindle::detail::task_names_held() == before);
        // A named task the loop destroys before it ran.
        (void)l.spawn(sleep_for_long(10s), "left parked");
        (void)l.run_once(0ns);
        CHECK(spindle::detail::task_names_held() == before + 1);
    }
    CHECK(spindle::detail::task_names_held() == before);
}
