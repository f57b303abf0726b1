#pragma once
/// Everything spindle offers, in one include.

#include <spindle/io.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/loop_thread.hpp>
#include <spindle/result.hpp>
#include <spindle/signal.hpp>
#include <spindle/sleep.hpp>
#include <spindle/task.hpp>
#include <spindle/timeout.hpp>
#include <spindle/timer.hpp>
#include <spindle/watcher.hpp>
#include <spindle/when_all.hpp>
