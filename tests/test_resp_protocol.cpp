// The RESP2 protocol core of the key-value example (docs/examples/resp): the
// exact bytes of every reply, pipelining, incremental parsing, inline
// commands, protocol errors, and that the steady state does not allocate.

#include "catch.hpp"

#include "resp_protocol.hpp"

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <new>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace std::string_literals;
using namespace std::string_view_literals;
namespace resp = spindle::examples::resp;

// Every allocation in the process is counted, so a test can prove that a
// stretch of work made none. The whole family of unaligned forms is replaced:
// one left to the library would pair its allocation with our free.
namespace {
std::atomic<std::size_t> g_allocations{0};

void* counted_allocation(std::size_t size) noexcept {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    return std::malloc(size ? size : 1);
}
} // namespace

void* operator new(std::size_t size) {
    if (void* p = counted_allocation(size)) return p;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) { return ::operator new(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept { return counted_allocation(size); }
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept { return counted_allocation(size); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

/// The pieces joined. (g++ 12 at -O2 warns wrongly about "literal" + a
/// temporary std::string, which would fail a -Werror build.)
std::string cat(std::initializer_list<std::string_view> pieces) {
    std::string text;
    for (const std::string_view piece : pieces) text += piece;
    return text;
}

/// A RESP array of bulk strings, as clients send commands.
std::string multibulk(const std::vector<std::string>& args) {
    std::string text = cat({"*", std::to_string(args.size()), "\r\n"});
    for (const std::string& arg : args) text += cat({"$", std::to_string(arg.size()), "\r\n", arg, "\r\n"});
    return text;
}

std::string bulk(std::string_view bytes) { return cat({"$", std::to_string(bytes.size()), "\r\n", bytes, "\r\n"}); }

/// The replies to complete commands that must leave the connection open and
/// consume every byte.
std::string reply_to(resp::store& db, std::string_view input) {
    resp::output_buffer out;
    const resp::batch_result result = resp::handle_batch(input, db, out);
    REQUIRE(result.consumed == input.size());
    REQUIRE_FALSE(result.close);
    return std::string(out.view());
}

std::string command(resp::store& db, const std::vector<std::string>& args) { return reply_to(db, multibulk(args)); }

/// The reply to input that must end in a protocol error.
std::string protocol_error(std::string_view input, std::size_t expected_consumed = 0) {
    resp::store db;
    resp::output_buffer out;
    const resp::batch_result result = resp::handle_batch(input, db, out);
    REQUIRE(result.close);
    REQUIRE(result.consumed == expected_consumed);
    return std::string(out.view());
}

resp::parse_status status_of(std::string_view input) {
    resp::request_parser parser;
    return parser.parse(input).status;
}

} // namespace

// --- replies, command by command -------------------------------------------------

TEST_CASE("PING and ECHO", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"PING"}) == "+PONG\r\n");
    REQUIRE(command(db, {"PING", "hello"}) == "$5\r\nhello\r\n");
    REQUIRE(command(db, {"PING", ""}) == "$0\r\n\r\n");
    REQUIRE(command(db, {"PING", "a", "b"}) == "-ERR wrong number of arguments for 'ping' command\r\n");
    REQUIRE(command(db, {"ECHO", "hi there"}) == "$8\r\nhi there\r\n");
    REQUIRE(command(db, {"ECHO"}) == "-ERR wrong number of arguments for 'echo' command\r\n");
    REQUIRE(command(db, {"ECHO", "a", "b"}) == "-ERR wrong number of arguments for 'echo' command\r\n");
}

TEST_CASE("SET and GET", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"GET", "k"}) == "$-1\r\n");
    REQUIRE(command(db, {"SET", "k", "v"}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$1\r\nv\r\n");
    REQUIRE(command(db, {"SET", "k", "a longer value"}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$14\r\na longer value\r\n");
    REQUIRE(command(db, {"SET", "empty", ""}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", "empty"}) == "$0\r\n\r\n");
    REQUIRE(db.size() == 2);

    SECTION("wrong arity") {
        REQUIRE(command(db, {"GET"}) == "-ERR wrong number of arguments for 'get' command\r\n");
        REQUIRE(command(db, {"GET", "a", "b"}) == "-ERR wrong number of arguments for 'get' command\r\n");
        REQUIRE(command(db, {"SET", "k"}) == "-ERR wrong number of arguments for 'set' command\r\n");
        REQUIRE(command(db, {"GET", "k"}) == "$14\r\na longer value\r\n");
    }
}

TEST_CASE("SET options NX, XX and GET", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"SET", "k", "v1", "XX"}) == "$-1\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$-1\r\n");
    REQUIRE(command(db, {"SET", "k", "v1", "nx"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "k", "v2", "NX"}) == "$-1\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$2\r\nv1\r\n");
    REQUIRE(command(db, {"SET", "k", "v3", "xx"}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$2\r\nv3\r\n");
    // GET replies the old value instead of OK, whether or not the SET happens.
    REQUIRE(command(db, {"SET", "k", "v4", "GET"}) == "$2\r\nv3\r\n");
    REQUIRE(command(db, {"SET", "k", "v5", "NX", "GET"}) == "$2\r\nv4\r\n");
    REQUIRE(command(db, {"GET", "k"}) == "$2\r\nv4\r\n");
    REQUIRE(command(db, {"SET", "new", "x", "GET"}) == "$-1\r\n");
    REQUIRE(command(db, {"GET", "new"}) == "$1\r\nx\r\n");
}

TEST_CASE("SET option errors", "[resp]") {
    resp::store db;
    const std::string syntax = "-ERR syntax error\r\n";
    const std::string not_integer = "-ERR value is not an integer or out of range\r\n";
    const std::string bad_expire = "-ERR invalid expire time in 'set' command\r\n";
    REQUIRE(command(db, {"SET", "k", "v", "NX", "XX"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "FOO"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "EX"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "EX", "10", "PX", "10"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "KEEPTTL", "EX", "10"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "EXAT", "10", "PXAT", "10"}) == syntax);
    // All options are read before the expire time is.
    REQUIRE(command(db, {"SET", "k", "v", "EX", "abc", "NX", "XX"}) == syntax);
    REQUIRE(command(db, {"SET", "k", "v", "EX", "abc"}) == not_integer);
    REQUIRE(command(db, {"SET", "k", "v", "PX", "1.5"}) == not_integer);
    REQUIRE(command(db, {"SET", "k", "v", "EX", "0"}) == bad_expire);
    REQUIRE(command(db, {"SET", "k", "v", "PX", "-5"}) == bad_expire);
    REQUIRE(command(db, {"SET", "k", "v", "EX", "9223372036854776"}) == bad_expire);
    REQUIRE(command(db, {"SET", "k", "v", "EX", "9223372036854775"}) == bad_expire);
    REQUIRE(command(db, {"SET", "k", "v", "PX", "9223372036854775807"}) == bad_expire);
    REQUIRE(db.size() == 0);
}

TEST_CASE("SET expiry", "[resp]") {
    using namespace std::chrono_literals;
    resp::store db;
    // 100 ms is the margin for the commands between a SET and the sleep.
    REQUIRE(command(db, {"SET", "short", "v", "PX", "100"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "long", "v", "EX", "1000"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "kept", "v", "PX", "100"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "kept", "w", "KEEPTTL"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "cleared", "v", "PX", "100"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "cleared", "w"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "counter", "5", "PX", "100"}) == "+OK\r\n");
    REQUIRE(command(db, {"INCR", "counter"}) == ":6\r\n");
    REQUIRE(command(db, {"SET", "past", "v", "EXAT", "1"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "future", "v", "PXAT", "99999999999999"}) == "+OK\r\n");
    REQUIRE(db.size() == 7);
    std::this_thread::sleep_for(250ms);

    REQUIRE(command(db, {"GET", "short"}) == "$-1\r\n");
    REQUIRE(command(db, {"EXISTS", "short", "long", "future"}) == ":2\r\n");
    REQUIRE(command(db, {"GET", "long"}) == "$1\r\nv\r\n");
    REQUIRE(command(db, {"GET", "kept"}) == "$-1\r\n");
    REQUIRE(command(db, {"GET", "cleared"}) == "$1\r\nw\r\n");
    REQUIRE(command(db, {"GET", "counter"}) == "$-1\r\n");
    REQUIRE(command(db, {"DEL", "past"}) == ":0\r\n");
    // Expired keys are reclaimed as they are looked up.
    REQUIRE(db.size() == 3);
    REQUIRE(command(db, {"SET", "short", "again", "NX"}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", "short"}) == "$5\r\nagain\r\n");
}

TEST_CASE("DEL and EXISTS count keys", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"SET", "a", "1"}) == "+OK\r\n");
    REQUIRE(command(db, {"SET", "b", "2"}) == "+OK\r\n");
    REQUIRE(command(db, {"EXISTS", "a"}) == ":1\r\n");
    REQUIRE(command(db, {"EXISTS", "nope"}) == ":0\r\n");
    REQUIRE(command(db, {"EXISTS", "a", "b", "nope", "a"}) == ":3\r\n");
    REQUIRE(command(db, {"EXISTS", "a", "a"}) == ":2\r\n");
    REQUIRE(command(db, {"DEL", "a", "nope", "a"}) == ":1\r\n");
    REQUIRE(command(db, {"EXISTS", "a", "b"}) == ":1\r\n");
    REQUIRE(command(db, {"DEL", "b"}) == ":1\r\n");
    REQUIRE(command(db, {"DEL", "b"}) == ":0\r\n");
    REQUIRE(db.size() == 0);
    REQUIRE(command(db, {"DEL"}) == "-ERR wrong number of arguments for 'del' command\r\n");
    REQUIRE(command(db, {"EXISTS"}) == "-ERR wrong number of arguments for 'exists' command\r\n");
}

TEST_CASE("INCR", "[resp]") {
    resp::store db;
    const std::string not_integer = "-ERR value is not an integer or out of range\r\n";
    REQUIRE(command(db, {"INCR", "n"}) == ":1\r\n");
    REQUIRE(command(db, {"INCR", "n"}) == ":2\r\n");
    REQUIRE(command(db, {"GET", "n"}) == "$1\r\n2\r\n");
    REQUIRE(command(db, {"SET", "n", "-1"}) == "+OK\r\n");
    REQUIRE(command(db, {"INCR", "n"}) == ":0\r\n");
    REQUIRE(command(db, {"INCR", "n"}) == ":1\r\n");
    REQUIRE(command(db, {"SET", "n", "99"}) == "+OK\r\n");
    REQUIRE(command(db, {"INCR", "n"}) == ":100\r\n");
    REQUIRE(command(db, {"GET", "n"}) == "$3\r\n100\r\n");
    REQUIRE(command(db, {"INCR"}) == "-ERR wrong number of arguments for 'incr' command\r\n");

    SECTION("the extremes of a signed 64-bit integer") {
        REQUIRE(command(db, {"SET", "n", "-9223372036854775808"}) == "+OK\r\n");
        REQUIRE(command(db, {"INCR", "n"}) == ":-9223372036854775807\r\n");
        REQUIRE(command(db, {"SET", "n", "9223372036854775806"}) == "+OK\r\n");
        REQUIRE(command(db, {"INCR", "n"}) == ":9223372036854775807\r\n");
        // Redis 7's words for an increment past the maximum.
        REQUIRE(command(db, {"INCR", "n"}) == "-ERR increment or decrement would overflow\r\n");
        REQUIRE(command(db, {"GET", "n"}) == "$19\r\n9223372036854775807\r\n");
        REQUIRE(command(db, {"SET", "n", "9223372036854775808"}) == "+OK\r\n");
        REQUIRE(command(db, {"INCR", "n"}) == not_integer);
        REQUIRE(command(db, {"SET", "n", "-9223372036854775809"}) == "+OK\r\n");
        REQUIRE(command(db, {"INCR", "n"}) == not_integer);
    }

    SECTION("only canonical decimals are integers") {
        for (const char* text : {"abc", "", "1.5", " 1", "1 ", "+1", "01", "-0", "-", "1e3", "0x10", "99999999999999999999"}) {
            INFO("value: '" << text << "'");
            REQUIRE(command(db, {"SET", "n", text}) == "+OK\r\n");
            REQUIRE(command(db, {"INCR", "n"}) == not_integer);
            REQUIRE(command(db, {"GET", "n"}) == bulk(text));
        }
        REQUIRE(command(db, {"SET", "n", "0"}) == "+OK\r\n");
        REQUIRE(command(db, {"INCR", "n"}) == ":1\r\n");
    }
}

TEST_CASE("command names are case-insensitive", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"set", "k", "v"}) == "+OK\r\n");
    REQUIRE(command(db, {"gEt", "k"}) == "$1\r\nv\r\n");
    REQUIRE(command(db, {"Ping"}) == "+PONG\r\n");
    REQUIRE(command(db, {"exists", "k"}) == ":1\r\n");
    REQUIRE(command(db, {"config", "get", "APPENDONLY"}) == "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
    // Keys are not.
    REQUIRE(command(db, {"GET", "K"}) == "$-1\r\n");
}

TEST_CASE("unknown commands are answered as Redis 7 does", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"foo"}) == "-ERR unknown command 'foo', with args beginning with: \r\n");
    REQUIRE(command(db, {"FOO", "a", "b c"}) == "-ERR unknown command 'FOO', with args beginning with: 'a' 'b c' \r\n");
    REQUIRE(command(db, {""}) == "-ERR unknown command '', with args beginning with: \r\n");

    SECTION("the name and the arguments are cut at 128 characters") {
        const std::string name(200, 'n');
        const std::string a(100, 'a');
        const std::string b(100, 'b');
        REQUIRE(command(db, {name, a, b, "c"}) == cat({"-ERR unknown command '", std::string(128, 'n'),
                                                       "', with args beginning with: '", a, "' '", std::string(25, 'b'),
                                                       "' \r\n"}));
    }

    SECTION("line endings in them become spaces") {
        REQUIRE(command(db, {"x\r\n+OK", "a\nb"}) == "-ERR unknown command 'x  +OK', with args beginning with: 'a b' \r\n");
    }
}

TEST_CASE("COMMAND", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"COMMAND"}) == "*0\r\n");
    REQUIRE(command(db, {"COMMAND", "DOCS"}) == "*0\r\n");
    REQUIRE(command(db, {"command", "docs", "get"}) == "*0\r\n");
    REQUIRE(command(db, {"COMMAND", "INFO", "get"}) == "*0\r\n");
    REQUIRE(command(db, {"COMMAND", "COUNT"}) == ":10\r\n");
    REQUIRE(command(db, {"COMMAND", "COUNT", "x"}) == "-ERR wrong number of arguments for 'command|count' command\r\n");
    REQUIRE(command(db, {"COMMAND", "bogus"}) == "-ERR unknown subcommand 'bogus'. Try COMMAND HELP.\r\n");
}

TEST_CASE("CONFIG GET", "[resp]") {
    resp::store db;
    REQUIRE(command(db, {"CONFIG", "GET", "save"}) == "*2\r\n$4\r\nsave\r\n$0\r\n\r\n");
    REQUIRE(command(db, {"CONFIG", "GET", "appendonly"}) == "*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
    REQUIRE(command(db, {"CONFIG", "GET", "appendonly", "save", "maxmemory", "save"}) ==
            "*4\r\n$4\r\nsave\r\n$0\r\n\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
    REQUIRE(command(db, {"CONFIG", "GET", "maxmemory"}) == "*0\r\n");
    REQUIRE(command(db, {"CONFIG", "GET"}) == "-ERR wrong number of arguments for 'config|get' command\r\n");
    REQUIRE(command(db, {"CONFIG"}) == "-ERR wrong number of arguments for 'config' command\r\n");
    REQUIRE(command(db, {"CONFIG", "SET", "save", ""}) == "-ERR unknown subcommand 'SET'. Try CONFIG HELP.\r\n");
}

TEST_CASE("what redis-benchmark sends before it starts", "[resp]") {
    // Captured from redis-benchmark 7.0: two pipelined CONFIG GETs, each
    // answered with a name and a value so it fetches the server's config.
    resp::store db;
    REQUIRE(reply_to(db, "*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$4\r\nsave\r\n"
                         "*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$10\r\nappendonly\r\n") ==
            "*2\r\n$4\r\nsave\r\n$0\r\n\r\n*2\r\n$10\r\nappendonly\r\n$2\r\nno\r\n");
}

TEST_CASE("QUIT replies OK and closes", "[resp]") {
    resp::store db;
    resp::output_buffer out;
    const std::string input = multibulk({"SET", "a", "1"}) + multibulk({"QUIT"}) + multibulk({"SET", "b", "2"});
    const resp::batch_result result = resp::handle_batch(input, db, out);
    REQUIRE(result.close);
    REQUIRE(result.consumed == input.size() - multibulk({"SET", "b", "2"}).size());
    REQUIRE(out.view() == "+OK\r\n+OK\r\n");
    REQUIRE(command(db, {"EXISTS", "a", "b"}) == ":1\r\n");

    SECTION("with any arguments, inline too") {
        out.clear();
        const resp::batch_result inline_quit = resp::handle_batch("quit extra words\r\nPING\r\n", db, out);
        REQUIRE(inline_quit.close);
        REQUIRE(inline_quit.consumed == 18);
        REQUIRE(out.view() == "+OK\r\n");
    }
}

// --- pipelining and incremental parsing ------------------------------------------

TEST_CASE("a pipeline is handled in one call", "[resp]") {
    resp::store db;
    std::string input;
    std::string expected;
    for (int i = 0; i < 1000; ++i) {
        const std::string key = cat({"key:", std::to_string(i)});
        const std::string value = cat({"value-", std::to_string(i)});
        input += multibulk({"SET", key, value});
        expected += "+OK\r\n";
        input += multibulk({"GET", key});
        expected += bulk(value);
        input += "INCR counter\r\n"; // inline and multibulk mixed
        expected += cat({":", std::to_string(i + 1), "\r\n"});
    }
    REQUIRE(reply_to(db, input) == expected);
    REQUIRE(db.size() == 1001);

    SECTION("a trailing incomplete command is left for later") {
        const std::string tail = multibulk({"GET", "key:7"});
        const std::string head = multibulk({"PING"}) + "PING\r\n";
        resp::output_buffer out;
        resp::request_parser parser;
        const std::string first = head + tail.substr(0, 9);
        const resp::batch_result partial = resp::handle_batch(first, db, out, parser);
        REQUIRE(partial.consumed == head.size());
        REQUIRE_FALSE(partial.close);
        REQUIRE(out.view() == "+PONG\r\n+PONG\r\n");
        // The unconsumed bytes, now at another address, and the rest.
        const std::string second = first.substr(partial.consumed) + tail.substr(9);
        const resp::batch_result rest = resp::handle_batch(second, db, out, parser);
        REQUIRE(rest.consumed == second.size());
        REQUIRE(out.view() == "+PONG\r\n+PONG\r\n$7\r\nvalue-7\r\n");
    }
}

TEST_CASE("a multibulk command fed a byte at a time", "[resp]") {
    const std::string input = multibulk({"SET", "key", "a value\r\nwith CRLF", "NX"});

    SECTION("every strict prefix is incomplete, to a fresh parser") {
        for (std::size_t n = 0; n < input.size(); ++n) {
            INFO("prefix of " << n << " bytes");
            REQUIRE(status_of(std::string_view(input).substr(0, n)) == resp::parse_status::incomplete);
        }
        resp::request_parser parser;
        const resp::parse_result whole = parser.parse(input);
        REQUIRE(whole.status == resp::parse_status::complete);
        REQUIRE(whole.consumed == input.size());
        REQUIRE(parser.args().size() == 4);
        REQUIRE(parser.args()[2] == "a value\r\nwith CRLF");
        REQUIRE(parser.args()[3] == "NX");
    }

    SECTION("and to one parser resuming, with the bytes moving every time") {
        resp::request_parser parser;
        for (std::size_t n = 0; n < input.size(); ++n) {
            const std::string moved = input.substr(0, n);
            INFO("prefix of " << n << " bytes");
            REQUIRE(parser.parse(moved).status == resp::parse_status::incomplete);
            REQUIRE(parser.args().empty());
        }
        const std::string whole = input + "PING\r\n";
        const resp::parse_result result = parser.parse(whole);
        REQUIRE(result.status == resp::parse_status::complete);
        REQUIRE(result.consumed == input.size());
        REQUIRE(parser.args().size() == 4);
        REQUIRE(parser.args()[0] == "SET");
        REQUIRE(parser.args()[1] == "key");
        REQUIRE(parser.args()[2] == "a value\r\nwith CRLF");
        // The arguments are views into the input, not copies.
        REQUIRE(parser.args()[1].data() == whole.data() + input.find("key"));
    }

    SECTION("through handle_batch, as a server would") {
        resp::store db;
        resp::output_buffer out;
        resp::request_parser parser;
        std::string buffer;
        const std::string stream = input + multibulk({"GET", "key"});
        for (const char byte : stream) {
            buffer.push_back(byte);
            const resp::batch_result result = resp::handle_batch(buffer, db, out, parser);
            REQUIRE_FALSE(result.close);
            buffer.erase(0, result.consumed);
        }
        REQUIRE(buffer.empty());
        REQUIRE(out.view() == "+OK\r\n$18\r\na value\r\nwith CRLF\r\n");
    }
}

TEST_CASE("a parser given fewer bytes than before starts over", "[resp]") {
    resp::request_parser parser;
    const std::string first = multibulk({"GET", "abc"});
    REQUIRE(parser.parse(std::string_view(first).substr(0, 15)).status == resp::parse_status::incomplete);
    const std::string other = multibulk({"PING"});
    const resp::parse_result result = parser.parse(other);
    REQUIRE(result.status == resp::parse_status::complete);
    REQUIRE(result.consumed == other.size());
    REQUIRE(parser.args().size() == 1);
    REQUIRE(parser.args()[0] == "PING");
}

TEST_CASE("empty commands are skipped without a reply", "[resp]") {
    resp::store db;
    REQUIRE(reply_to(db, "*0\r\n*-1\r\n\r\n\n   \t \r\nPING\r\n") == "+PONG\r\n");
}

// --- inline commands -------------------------------------------------------------

TEST_CASE("inline commands", "[resp]") {
    resp::store db;
    REQUIRE(reply_to(db, "PING\r\n") == "+PONG\r\n");
    REQUIRE(reply_to(db, "PING\n") == "+PONG\r\n");
    REQUIRE(reply_to(db, "SET k v\r\n") == "+OK\r\n");
    REQUIRE(reply_to(db, "  GET \t k  \r\n") == "$1\r\nv\r\n");
    REQUIRE(reply_to(db, "ECHO a\rb\n") == "-ERR wrong number of arguments for 'echo' command\r\n");
    REQUIRE(reply_to(db, "ECHO a\vb\n") == "$3\r\na\vb\r\n");
    REQUIRE(status_of("PING") == resp::parse_status::incomplete);
    REQUIRE(status_of("PING\r") == resp::parse_status::incomplete);

    SECTION("arguments are views into the line") {
        resp::request_parser parser;
        const std::string line = "SET key value\r\n";
        REQUIRE(parser.parse(line).consumed == line.size());
        REQUIRE(parser.args().size() == 3);
        REQUIRE(parser.args()[2] == "value");
        REQUIRE(parser.args()[2].data() == line.data() + 8);
    }

    SECTION("double quotes and their escapes") {
        REQUIRE(reply_to(db, "SET k \"hello world\"\r\n") == "+OK\r\n");
        REQUIRE(reply_to(db, "GET k\r\n") == "$11\r\nhello world\r\n");
        REQUIRE(reply_to(db, "ECHO \"a\\r\\n\\t\\\"\\\\\\x41\\x4a\\xzz\"\r\n") == bulk("a\r\n\t\"\\AJxzz"));
        REQUIRE(reply_to(db, "ECHO \"\"\r\n") == "$0\r\n\r\n");
        REQUIRE(reply_to(db, "ECHO ab\"c d\"\r\n") == bulk("abc d"));
        REQUIRE(reply_to(db, "ECHO \"\\x00\"\n") == bulk("\0"sv));
    }

    SECTION("single quotes") {
        REQUIRE(reply_to(db, "ECHO 'it\\'s \"here\"'\r\n") == bulk("it's \"here\""));
        REQUIRE(reply_to(db, "ECHO 'a\\nb'\r\n") == bulk("a\\nb"));
    }

    SECTION("several quoted words in one line") {
        REQUIRE(reply_to(db, "SET \"k 1\" 'v 1'\nGET \"k 1\"\n") == "+OK\r\n$3\r\nv 1\r\n");
        // Longer than a small string, so decoding the second must not move the first.
        const std::string key = "a key \\x41 of some length";
        const std::string value = "and a value \\x42 longer still than that";
        REQUIRE(reply_to(db, "SET \"" + key + "\" \"" + value + "\"\r\n") == "+OK\r\n");
        REQUIRE(command(db, {"GET", "a key A of some length"}) == bulk("and a value B longer still than that"));
    }

    SECTION("unbalanced quotes are a protocol error") {
        const std::string error = "-ERR Protocol error: unbalanced quotes in request\r\n";
        REQUIRE(protocol_error("ECHO \"abc\r\n") == error);
        REQUIRE(protocol_error("ECHO 'abc\r\n") == error);
        REQUIRE(protocol_error("ECHO \"abc\"def\r\n") == error);
        REQUIRE(protocol_error("ECHO \"abc\\\"\r\n") == error);
        REQUIRE(protocol_error("PING\r\nECHO 'a'b\r\n", 6) == "+PONG\r\n" + error);
    }
}

// Found by fuzzing (tests/fuzz/fuzz_resp.cpp): the words before a bad quote
// stayed in args() after the error.
TEST_CASE("after a protocol error args() is empty", "[resp]") {
    for (const std::string_view input : {"ECHO a b \"c\r\n"sv, "SET k 'v'w\r\n"sv, "*2\r\n$4\r\nECHO\r\n:1\r\n"sv}) {
        INFO(input);
        resp::request_parser parser;
        REQUIRE(parser.parse(input).status == resp::parse_status::error);
        REQUIRE(parser.args().empty());
    }
}

TEST_CASE("inline lines are limited to 64 KiB", "[resp]") {
    const std::string error = "-ERR Protocol error: too big inline request\r\n";
    const std::string longest = cat({"ECHO ", std::string(resp::max_inline_length - 5, 'x')});
    REQUIRE(longest.size() == 64 * 1024);

    resp::store db;
    REQUIRE(reply_to(db, longest + "\r\n") == bulk(longest.substr(5)));
    REQUIRE(reply_to(db, longest + "\n") == bulk(longest.substr(5)));
    // Without its line ending yet: it may still be within the limit.
    REQUIRE(status_of(longest) == resp::parse_status::incomplete);
    REQUIRE(status_of(longest + "\r") == resp::parse_status::incomplete);

    REQUIRE(protocol_error(longest + "y\r\n") == error);
    REQUIRE(protocol_error(longest + "y\n") == error);
    // Too long before its end has even arrived.
    REQUIRE(protocol_error(longest + "yz") == error);
    REQUIRE(protocol_error(longest + "\rz") == error);
}

// --- protocol errors -------------------------------------------------------------

TEST_CASE("protocol errors reply, then close", "[resp]") {
    const std::string invalid_multibulk = "-ERR Protocol error: invalid multibulk length\r\n";
    const std::string invalid_bulk = "-ERR Protocol error: invalid bulk length\r\n";

    SECTION("a bulk that does not start with $") {
        REQUIRE(protocol_error("*1\r\nx") == "-ERR Protocol error: expected '$', got 'x'\r\n");
        REQUIRE(protocol_error("*2\r\n$3\r\nGET\r\n:1\r\n") == "-ERR Protocol error: expected '$', got ':'\r\n");
        REQUIRE(protocol_error("*1\r\n\r\n") == "-ERR Protocol error: expected '$', got ' '\r\n");
    }

    SECTION("multibulk lengths") {
        REQUIRE(protocol_error("*x\r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*\r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*01\r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*+1\r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*1 \r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*1\rx") == invalid_multibulk);
        REQUIRE(protocol_error("*1048577\r\n") == invalid_multibulk);
        REQUIRE(protocol_error("*99999999999999999999\r\n") == invalid_multibulk);
        // Twenty-one characters without a line ending cannot be a length.
        REQUIRE(protocol_error("*111111111111111111111") == invalid_multibulk);
        REQUIRE(status_of("*11111111111111111111") == resp::parse_status::incomplete);
        REQUIRE(status_of("*1048576\r\n") == resp::parse_status::incomplete);
    }

    SECTION("bulk lengths") {
        REQUIRE(protocol_error("*1\r\n$-1\r\n") == invalid_bulk);
        REQUIRE(protocol_error("*1\r\n$x\r\n") == invalid_bulk);
        REQUIRE(protocol_error("*1\r\n$3x") == invalid_bulk);
        REQUIRE(protocol_error("*1\r\n$536870913\r\n") == invalid_bulk);
        REQUIRE(protocol_error("*1\r\n$9223372036854775808\r\n") == invalid_bulk);
        // The largest bulk Redis accepts waits for its bytes, without allocating for them.
        REQUIRE(status_of("*1\r\n$536870912\r\n") == resp::parse_status::incomplete);
    }

    SECTION("bulk data not followed by CRLF") {
        const std::string error = "-ERR Protocol error: expected '\\r\\n' after bulk data\r\n";
        REQUIRE(protocol_error("*1\r\n$4\r\nPINGxx") == error);
        REQUIRE(protocol_error("*1\r\n$4\r\nPING\rx") == error);
        REQUIRE(protocol_error("*1\r\n$3\r\nPING\r\n") == error);
        REQUIRE(status_of("*1\r\n$4\r\nPING\r") == resp::parse_status::incomplete);
    }

    SECTION("commands before the error run and keep their replies") {
        const std::string good = multibulk({"SET", "k", "v"}) + "PING\r\n";
        resp::store db;
        resp::output_buffer out;
        const resp::batch_result result = resp::handle_batch(good + "*1\r\n$-5\r\n" + multibulk({"PING"}), db, out);
        REQUIRE(result.close);
        REQUIRE(result.consumed == good.size());
        REQUIRE(out.view() == "+OK\r\n+PONG\r\n" + invalid_bulk);
        REQUIRE(command(db, {"GET", "k"}) == "$1\r\nv\r\n");
    }

    SECTION("the parser is reusable after an error") {
        resp::request_parser parser;
        const resp::parse_result bad = parser.parse("*1\r\n$2\r\nabc\r\n");
        REQUIRE(bad.status == resp::parse_status::error);
        REQUIRE(bad.error == "Protocol error: expected '\\r\\n' after bulk data");
        REQUIRE(parser.parse("PING\r\n").status == resp::parse_status::complete);
        REQUIRE(parser.args().size() == 1);
    }
}

// --- binary safety -----------------------------------------------------------------

TEST_CASE("keys and values are binary-safe", "[resp]") {
    resp::store db;
    const std::string key = "k\0\r\n"s;
    const std::string value = "\r\n\0$3\r\n*1\r\n\xff"s;
    REQUIRE(command(db, {"SET", key, value}) == "+OK\r\n");
    REQUIRE(command(db, {"GET", key}) == bulk(value));
    REQUIRE(command(db, {"GET", "k"}) == "$-1\r\n");
    REQUIRE(command(db, {"EXISTS", key, "k\0"s, "k"}) == ":1\r\n");
    REQUIRE(command(db, {"ECHO", "\0"s}) == "$1\r\n\0\r\n"s);
    REQUIRE(command(db, {"DEL", key}) == ":1\r\n");
    REQUIRE(db.size() == 0);
}

// --- buffers and allocation ------------------------------------------------------

TEST_CASE("output_buffer", "[resp]") {
    resp::output_buffer out;
    out.append_simple("OK");
    out.append_error("ERR no");
    out.append_integer(-42);
    out.append_bulk("a\r\nb");
    out.append_null();
    out.append_array(3);
    REQUIRE(out.view() == "+OK\r\n-ERR no\r\n:-42\r\n$4\r\na\r\nb\r\n$-1\r\n*3\r\n");
    out.consume(5);
    REQUIRE(out.view() == "-ERR no\r\n:-42\r\n$4\r\na\r\nb\r\n$-1\r\n*3\r\n");
    REQUIRE(out.size() == 34);
    out.consume(100);
    REQUIRE(out.empty());

    out.append_bulk(std::string(100000, 'x'));
    const std::size_t capacity = out.capacity();
    REQUIRE(capacity >= 100000);
    out.clear();
    REQUIRE(out.empty());
    REQUIRE(out.capacity() == capacity);
    out.append_integer(std::numeric_limits<std::int64_t>::min());
    REQUIRE(out.view() == ":-9223372036854775808\r\n");
}

TEST_CASE("the steady state does not allocate", "[resp]") {
    resp::store db;
    resp::output_buffer out;
    resp::request_parser parser;
    std::vector<std::string> many_keys{"DEL"};
    for (int i = 0; i < 100; ++i) many_keys.push_back(cat({"a missing key with a long name:", std::to_string(i)}));
    // Keys longer than a small string, so looking one up through a copy would show.
    const std::string key = "a key that does not fit in a small string";
    const std::string batch = multibulk({"SET", key, "a value that does not fit in a small string"}) +
                              multibulk({"GET", key}) + multibulk({"INCR", "a counter with a long name"}) +
                              "PING\r\n" + "SET \"" + key + "\" \"a value that does not fit in a small string\"\r\n" +
                              multibulk({"EXISTS", key, "a missing key with a long name"}) + multibulk(many_keys) +
                              multibulk({"NOSUCH", "command"}) + multibulk({"GET"}) +
                              multibulk({"CONFIG", "GET", "save"}) + multibulk({"COMMAND", "DOCS"}) +
                              multibulk({"ECHO", "hi"}) + multibulk({"SET", key, "short"});

    // Warm up: new keys, and every buffer grown to its size.
    for (int i = 0; i < 2; ++i) {
        out.clear();
        const resp::batch_result result = resp::handle_batch(batch, db, out, parser);
        REQUIRE(result.consumed == batch.size());
    }
    std::string expected(out.view());
    REQUIRE(expected.find(":2\r\n") != std::string::npos);
    expected.replace(expected.find(":2\r\n"), 4, ":102\r\n");

    const std::size_t before = g_allocations.load();
    for (int i = 0; i < 100; ++i) {
        out.clear();
        const resp::batch_result result = resp::handle_batch(batch, db, out, parser);
        if (result.consumed != batch.size()) break;
    }
    const std::size_t allocations = g_allocations.load() - before;
    REQUIRE(allocations == 0);
    REQUIRE(out.view() == expected);
    REQUIRE(command(db, {"GET", "a counter with a long name"}) == "$3\r\n102\r\n");
}
