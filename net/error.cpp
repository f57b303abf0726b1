#include <spindle/net/error.hpp>

#include <string>

namespace spindle::net {

namespace {

class category final : public std::error_category {
public:
    const char* name() const noexcept override { return "spindle.net"; }
    std::string message(int value) const override {
        switch (static_cast<errc>(value)) {
            case errc::end_of_stream: return "end of stream";
            case errc::line_too_long: return "line too long";
            case errc::datagram_truncated: return "datagram truncated";
            case errc::resolve_failed: return "name resolution failed";
            case errc::invalid_address: return "invalid address";
        }
        return "unknown spindle.net error";
    }
};

}  // namespace

const std::error_category& net_category() noexcept {
    static const category instance;
    return instance;
}

}  // namespace spindle::net
