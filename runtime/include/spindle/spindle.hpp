#pragma once
/// Everything spindle offers, in one include.

#include <spindle/backend_kind.hpp>
#include <spindle/budget.hpp>
#include <spindle/channel.hpp>
#include <spindle/errc.hpp>
#include <spindle/event.hpp>
#include <spindle/io.hpp>
#include <spindle/join_handle.hpp>
#include <spindle/latch.hpp>
#include <spindle/log.hpp>
#include <spindle/loop.hpp>
#include <spindle/loop_thread.hpp>
#include <spindle/mutex.hpp>
#include <spindle/park.hpp>
#include <spindle/readiness.hpp>
#include <spindle/result.hpp>
#include <spindle/semaphore.hpp>
#include <spindle/signal.hpp>
#include <spindle/sleep.hpp>
#include <spindle/task.hpp>
#include <spindle/task_group.hpp>
#include <spindle/timeout.hpp>
#include <spindle/timer.hpp>
#include <spindle/watcher.hpp>
#include <spindle/when_all.hpp>
#include <spindle/when_any.hpp>
