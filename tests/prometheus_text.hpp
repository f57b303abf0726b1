#pragma once
// A checker of the Prometheus text exposition format (version 0.0.4), for
// tests of what spindle writes: the unit test of to_prometheus, and the
// example services' /metrics scraped over HTTP.
//
// It is stricter than Prometheus in the places where spindle promises more
// than the format asks: every sample's family has a TYPE line, a counter's
// name ends in _total, a family's samples come together, and no line is
// empty. It does not depend on Catch2, so that a test can feed it bad text
// and check that it says so.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace spindle::test::prometheus {

/// What a valid text holds.
struct exposition {
    /// Every sample, keyed by its series: the name, then its labels sorted by
    /// name as `{a="x",b="y"}` (values escaped as written), nothing for none.
    std::map<std::string, double> values;
    /// Each sample series' family (a histogram's _bucket, _sum and _count
    /// samples belong to the histogram's name).
    std::map<std::string, std::string> family_of;
    /// Each family's TYPE: counter, gauge, histogram, summary or untyped.
    std::map<std::string, std::string> types;
};

/// The checker's verdict: `error` is empty when the text is valid.
struct parse_outcome {
    std::string error;
    exposition text;
    bool ok() const noexcept { return error.empty(); }
};

namespace detail {

inline bool is_name_start(char c) noexcept { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
inline bool is_name_char(char c) noexcept { return is_name_start(c) || (c >= '0' && c <= '9'); }

/// [a-zA-Z_:][a-zA-Z0-9_:]*
inline bool is_metric_name(std::string_view s) noexcept {
    if (s.empty() || !(is_name_start(s[0]) || s[0] == ':')) return false;
    return std::all_of(s.begin(), s.end(), [](char c) { return is_name_char(c) || c == ':'; });
}

/// [a-zA-Z_][a-zA-Z0-9_]*, and not the reserved __ prefix.
inline bool is_label_name(std::string_view s) noexcept {
    if (s.empty() || !is_name_start(s[0]) || s.starts_with("__")) return false;
    return std::all_of(s.begin(), s.end(), is_name_char);
}

/// A value as Go's strconv.ParseFloat reads what Prometheus writes: a
/// decimal float, or +Inf, -Inf, Inf, NaN. Hexadecimal floats and
/// underscores, which Go also takes, never appear in an exposition.
inline bool parse_float(std::string_view s, double& out) noexcept {
    if (s == "+Inf" || s == "Inf") {
        out = std::numeric_limits<double>::infinity();
        return true;
    }
    if (s == "-Inf") {
        out = -std::numeric_limits<double>::infinity();
        return true;
    }
    if (s == "NaN") {
        out = std::numeric_limits<double>::quiet_NaN();
        return true;
    }
    if (s.starts_with('+')) s.remove_prefix(1);
    // from_chars would also take "inf", "nan(...)" and "infinity": only
    // digits, a sign, a point and an exponent get this far.
    if (s.empty() || !std::all_of(s.begin(), s.end(), [](char c) {
            return (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '+' || c == 'e' || c == 'E';
        })) {
        return false;
    }
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
    return ec == std::errc() && end == s.data() + s.size();
}

/// Reads `"value"` at `pos` with its escapes (\\, \", \n); moves past the
/// closing quote. `raw` keeps the escapes as written, for the series key.
inline bool read_label_value(std::string_view line, std::size_t& pos, std::string& raw) {
    if (pos >= line.size() || line[pos] != '"') return false;
    ++pos;
    for (; pos < line.size(); ++pos) {
        const char c = line[pos];
        if (c == '"') {
            ++pos;
            return true;
        }
        if (c == '\\') {
            if (pos + 1 >= line.size()) return false;
            const char next = line[pos + 1];
            if (next != '\\' && next != '"' && next != 'n') return false;
            raw += c;
            raw += next;
            ++pos;
            continue;
        }
        raw += c;
    }
    return false;  // no closing quote
}

/// HELP text may escape only backslash and line feed.
inline bool valid_help(std::string_view text) noexcept {
    for (std::size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\') continue;
        if (i + 1 >= text.size() || (text[i + 1] != '\\' && text[i + 1] != 'n')) return false;
        ++i;
    }
    return true;
}

/// One bucket series of a histogram, without its le label.
struct bucket {
    double le;
    double count;
};

}  // namespace detail

/// Checks every line of `text`; the first fault found, with its line
/// number, or the samples.
inline parse_outcome parse(std::string_view text) {
    using namespace detail;
    parse_outcome result;
    exposition& out = result.text;
    auto fail = [&](std::size_t line_no, std::string why) {
        result.error = "line " + std::to_string(line_no) + ": " + std::move(why);
        return result;
    };

    std::set<std::string> helped;
    std::set<std::string> sampled;         // families that have had samples
    std::string current_family;            // the family of the previous sample
    // Histograms: buckets per series (labels without le), and _count per series.
    std::map<std::string, std::vector<bucket>> buckets;
    std::map<std::string, double> hist_counts;
    std::set<std::string> hist_sums;

    if (!text.empty() && !text.ends_with('\n')) return fail(0, "the text does not end with a line feed");
    std::size_t line_no = 0;
    for (std::size_t start = 0; start < text.size();) {
        const std::size_t end = text.find('\n', start);
        const std::string_view line = text.substr(start, end - start);
        start = end + 1;
        ++line_no;

        if (line.empty()) return fail(line_no, "an empty line");
        if (line[0] == '#') {
            // "# HELP name text", "# TYPE name type"; any other comment is ignored.
            std::string_view rest = line.substr(1);
            if (!rest.starts_with(" HELP ") && !rest.starts_with(" TYPE ")) continue;
            const bool is_help = rest.starts_with(" HELP ");
            rest.remove_prefix(6);
            const std::size_t space = rest.find(' ');
            const std::string name(rest.substr(0, space));
            const std::string_view arg = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
            if (!is_metric_name(name)) return fail(line_no, "not a metric name: '" + name + "'");
            if (is_help) {
                if (!helped.insert(name).second) return fail(line_no, "a second HELP line for " + name);
                if (!valid_help(arg)) return fail(line_no, "a bad escape in the HELP text of " + name);
                continue;
            }
            if (arg != "counter" && arg != "gauge" && arg != "histogram" && arg != "summary" && arg != "untyped")
                return fail(line_no, "not a metric type: '" + std::string(arg) + "'");
            if (out.types.count(name)) return fail(line_no, "a second TYPE line for " + name);
            if (sampled.count(name)) return fail(line_no, "the TYPE line of " + name + " after its samples");
            out.types[name] = std::string(arg);
            continue;
        }

        // name{label="value",...} value [timestamp]
        std::size_t pos = 0;
        while (pos < line.size() && line[pos] != '{' && line[pos] != ' ' && line[pos] != '\t') ++pos;
        const std::string name(line.substr(0, pos));
        if (!is_metric_name(name)) return fail(line_no, "not a metric name: '" + name + "'");
        std::vector<std::pair<std::string, std::string>> labels;
        if (pos < line.size() && line[pos] == '{') {
            ++pos;
            while (pos < line.size() && line[pos] != '}') {
                const std::size_t eq = line.find('=', pos);
                if (eq == std::string_view::npos) return fail(line_no, "a label without '='");
                std::string label(line.substr(pos, eq - pos));
                if (!is_label_name(label)) return fail(line_no, "not a label name: '" + label + "'");
                pos = eq + 1;
                std::string value;
                if (!read_label_value(line, pos, value)) return fail(line_no, "a badly quoted value of label " + label);
                if (std::any_of(labels.begin(), labels.end(), [&](const auto& l) { return l.first == label; }))
                    return fail(line_no, "label " + label + " twice");
                labels.emplace_back(std::move(label), std::move(value));
                if (pos < line.size() && line[pos] == ',') {
                    ++pos;
                    if (pos < line.size() && line[pos] == '}') return fail(line_no, "a comma before '}'");
                } else if (pos >= line.size() || line[pos] != '}') {
                    return fail(line_no, "labels not separated by ','");
                }
            }
            if (pos >= line.size()) return fail(line_no, "labels without '}'");
            ++pos;
        }
        if (pos >= line.size() || (line[pos] != ' ' && line[pos] != '\t')) return fail(line_no, "no value after " + name);
        while (pos < line.size() && (line[pos] == ' ' || line[pos] == '\t')) ++pos;
        std::string_view fields = line.substr(pos);
        const std::size_t gap = fields.find_first_of(" \t");
        const std::string_view value_text = fields.substr(0, gap);
        double value = 0;
        if (!parse_float(value_text, value)) return fail(line_no, "not a float: '" + std::string(value_text) + "'");
        if (gap != std::string_view::npos) {
            // An optional timestamp: milliseconds since the epoch, an integer.
            std::string_view stamp = fields.substr(gap);
            while (!stamp.empty() && (stamp[0] == ' ' || stamp[0] == '\t')) stamp.remove_prefix(1);
            long long ms = 0;
            const auto [e, ec] = std::from_chars(stamp.data(), stamp.data() + stamp.size(), ms);
            if (stamp.empty() || ec != std::errc() || e != stamp.data() + stamp.size())
                return fail(line_no, "after the value, not a timestamp: '" + std::string(stamp) + "'");
        }

        // Which family: the name itself, or a histogram's (or summary's) base name.
        std::string family = name;
        std::string suffix;
        if (!out.types.count(name)) {
            for (std::string_view s : {"_bucket", "_sum", "_count"}) {
                if (!std::string_view(name).ends_with(s)) continue;
                const std::string base = name.substr(0, name.size() - s.size());
                const auto t = out.types.find(base);
                if (t != out.types.end() && (t->second == "histogram" || (t->second == "summary" && s != "_bucket"))) {
                    family = base;
                    suffix = s;
                }
            }
        }
        const auto type = out.types.find(family);
        if (type == out.types.end()) return fail(line_no, "no TYPE line before the first sample of " + name);
        if (type->second == "counter" && !std::string_view(name).ends_with("_total"))
            return fail(line_no, "counter " + name + " does not end in _total");
        if (family != current_family) {
            if (sampled.count(family)) return fail(line_no, "the samples of " + family + " are not together");
            sampled.insert(family);
            current_family = family;
        }

        // The series: labels by name; a histogram's buckets are also kept
        // without le, to check them against each other and _count.
        std::sort(labels.begin(), labels.end());
        std::string key = name;
        std::string without_le;
        double le = 0;
        bool has_le = false;
        for (const auto& [label, raw] : labels) {
            key += (key.size() == name.size() ? "{" : ",") + label + "=\"" + raw + "\"";
            if (label == "le") {
                has_le = true;
                if (!parse_float(raw, le)) return fail(line_no, "le is not a float: '" + raw + "'");
            } else {
                without_le += label + "=\"" + raw + "\",";
            }
        }
        if (!labels.empty()) key += "}";
        if (!out.values.emplace(key, value).second) return fail(line_no, "series " + key + " twice");
        out.family_of[key] = family;

        if (type->second == "histogram") {
            if (suffix == "_bucket") {
                if (!has_le) return fail(line_no, "a bucket without le");
                buckets[family + "{" + without_le + "}"].push_back({le, value});
            } else if (suffix == "_count") {
                hist_counts[family + "{" + without_le + "}"] = value;
            } else if (suffix == "_sum") {
                hist_sums.insert(family + "{" + without_le + "}");
            } else {
                return fail(line_no, name + " is neither _bucket, _sum nor _count of histogram " + family);
            }
        }
    }

    for (auto& [series, list] : buckets) {
        std::sort(list.begin(), list.end(), [](const bucket& a, const bucket& b) { return a.le < b.le; });
        for (std::size_t i = 1; i < list.size(); ++i) {
            if (list[i].le == list[i - 1].le) return fail(line_no, "histogram " + series + " has two buckets of one le");
            if (list[i].count < list[i - 1].count) return fail(line_no, "histogram " + series + " is not cumulative");
        }
        if (!std::isinf(list.back().le) || list.back().le < 0)
            return fail(line_no, "histogram " + series + " has no le=\"+Inf\" bucket");
        const auto count = hist_counts.find(series);
        if (count == hist_counts.end()) return fail(line_no, "histogram " + series + " has no _count");
        if (count->second != list.back().count)
            return fail(line_no, "histogram " + series + ": _count differs from its +Inf bucket");
        if (!hist_sums.count(series)) return fail(line_no, "histogram " + series + " has no _sum");
    }
    for (const auto& [series, count] : hist_counts)
        if (!buckets.count(series)) return fail(line_no, "histogram " + series + " has a _count and no buckets");
    return result;
}

/// The series of `before` that a counter (or a histogram's buckets, sum or
/// count) has in `after` with a smaller value, or no longer has: each one a
/// line "series before -> after". Empty when every counter only grew.
inline std::vector<std::string> decreased_counters(const exposition& before, const exposition& after) {
    std::vector<std::string> wrong;
    for (const auto& [series, value] : before.values) {
        const std::string& type = before.types.at(before.family_of.at(series));
        if (type != "counter" && type != "histogram" && type != "summary") continue;
        if (type == "summary" && series.find("quantile=") != std::string::npos) continue;  // quantiles go either way
        const auto later = after.values.find(series);
        if (later == after.values.end()) {
            wrong.push_back(series + " " + std::to_string(value) + " -> gone");
        } else if (later->second < value) {
            wrong.push_back(series + " " + std::to_string(value) + " -> " + std::to_string(later->second));
        }
    }
    return wrong;
}

}  // namespace spindle::test::prometheus
