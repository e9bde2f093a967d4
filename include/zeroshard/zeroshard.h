// Umbrella header: everything a training program needs from zeroshard.
#pragma once

#include "zeroshard/activation_checkpointing.h"
#include "zeroshard/checkpoint.h"
#include "zeroshard/communicator.h"
#include "zeroshard/config.h"
#include "zeroshard/device.h"
#include "zeroshard/dtype.h"
#include "zeroshard/engine.h"
#include "zeroshard/error.h"
#include "zeroshard/log.h"
#include "zeroshard/lr_scheduler.h"
#include "zeroshard/memory_estimator.h"
#include "zeroshard/memory_report.h"
#include "zeroshard/optimizer.h"
