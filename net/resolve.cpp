#include <spindle/loop.hpp>
#include <spindle/net/error.hpp>
#include <spindle/net/resolve.hpp>
#include <spindle/park.hpp>
#include <spindle/remote_answer.hpp>

#include <atomic>
#include <charconv>
#include <optional>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <netdb.h>
#include <thread>
#include <vector>

namespace spindle::net {

namespace {

using lookup_result = result<std::vector<address>>;

// One lookup, shared by the awaiting task and the worker running it; the
// answer travels back to the task's loop as a remote_answer.
struct lookup : remote_answer<lookup_result> {
    std::string host;
    std::string service;
    resolve_hints hints;
};

class resolver_pool {
public:
    static resolver_pool& instance() {
        static resolver_pool pool;
        return pool;
    }

    void submit(std::shared_ptr<lookup> job) {
        {
            std::lock_guard lock(m_mutex);
            if (m_workers.empty())
                for (int i = 0; i < worker_count; ++i) m_workers.emplace_back([this] { work(); });
            m_jobs.push_back(std::move(job));
        }
        m_wake.notify_one();
    }

    ~resolver_pool() {
        {
            std::lock_guard lock(m_mutex);
            m_stopping = true;
        }
        m_wake.notify_all();
        for (auto& t : m_workers) t.join();
    }

private:
    // getaddrinfo is slow only when it goes to the network; two workers keep
    // one slow lookup from holding up every other.
    static constexpr int worker_count = 2;

    void work();

    std::mutex m_mutex;
    std::condition_variable m_wake;
    std::deque<std::shared_ptr<lookup>> m_jobs;
    std::vector<std::thread> m_workers;
    bool m_stopping = false;
};

lookup_result run_lookup(const lookup& job) {
    addrinfo hints{};
    hints.ai_family = job.hints.family == address_family::ipv4   ? AF_INET
                      : job.hints.family == address_family::ipv6 ? AF_INET6
                                                                 : AF_UNSPEC;
    hints.ai_socktype = job.hints.datagram ? SOCK_DGRAM : SOCK_STREAM;
    hints.ai_flags = AI_ADDRCONFIG;
    addrinfo* list = nullptr;
    int rc = ::getaddrinfo(job.host.c_str(), job.service.empty() ? nullptr : job.service.c_str(), &hints, &list);
    // AI_ADDRCONFIG hides loopback-only families on a host without other
    // addresses; ask again without it before giving up.
    if (rc == EAI_NONAME || rc == EAI_ADDRFAMILY) {
        hints.ai_flags = 0;
        rc = ::getaddrinfo(job.host.c_str(), job.service.empty() ? nullptr : job.service.c_str(), &hints, &list);
    }
    if (rc == EAI_SYSTEM) return std::error_code(errno, std::system_category());
    if (rc != 0) return make_error_code(errc::resolve_failed);
    std::vector<address> found;
    for (addrinfo* ai = list; ai; ai = ai->ai_next) {
        address a = address::from_native(ai->ai_addr, static_cast<socklen_t>(ai->ai_addrlen));
        bool seen = false;
        for (const address& b : found) seen = seen || a == b;
        if (!seen) found.push_back(a);
    }
    ::freeaddrinfo(list);
    if (found.empty()) return make_error_code(errc::resolve_failed);
    return found;
}

// The awaiting task parks on this until a worker answers (through a post to
// the loop) or the wait is cancelled.
class resolve_wait : public waiter {
public:
    explicit resolve_wait(std::shared_ptr<lookup> job) noexcept : m_job(std::move(job)) {}

    void on_park() {
        m_job->attach(*this);
        resolver_pool::instance().submit(m_job);
    }
    void on_cancel() noexcept {
        m_job->detach();
        complete_cancelled();
    }
    void on_abandon() noexcept { m_job->detach(); }
    void describe(std::string& out) const { out += "resolve " + m_job->host; }
    lookup_result take() {
        if (cancelled()) return cancelled_error();
        return m_job->take();
    }

private:
    std::shared_ptr<lookup> m_job;
};

void resolver_pool::work() {
    for (;;) {
        std::shared_ptr<lookup> job;
        {
            std::unique_lock lock(m_mutex);
            m_wake.wait(lock, [&] { return m_stopping || !m_jobs.empty(); });
            if (m_jobs.empty()) return;
            job = std::move(m_jobs.front());
            m_jobs.pop_front();
        }
        if (!job->awaited()) continue;  // nobody waits any more
        try {
            job->give(run_lookup(*job));
        } catch (...) {
            // No memory for the answer's post: the wait goes on until it is
            // cancelled, as it would for a lookup that never ends.
        }
    }
}

std::optional<address> numeric(const std::string& host, const std::string& service, address_family family) {
    unsigned port = 0;
    auto [end, ec] = std::from_chars(service.data(), service.data() + service.size(), port);
    if (service.empty() || ec != std::errc() || end != service.data() + service.size() || port > 65535) return std::nullopt;
    result<address> a = address::from_ip(host, static_cast<std::uint16_t>(port));
    if (!a) return std::nullopt;
    if (family != address_family::none && a->family() != family) return std::nullopt;
    return *a;
}

}  // namespace

task<result<std::vector<address>>> resolve(std::string host, std::string service, resolve_hints hints, std::stop_token token) {
    if (std::optional<address> a = numeric(host, service, hints.family)) co_return std::vector<address>{*a};
    auto job = std::make_shared<lookup>();
    job->host = std::move(host);
    job->service = std::move(service);
    job->hints = hints;
    co_return co_await parked<resolve_wait>(std::move(token), std::move(job));
}

}  // namespace spindle::net
