/* gh200core.h: everything of the public API in one include. */
#ifndef GHC_GH200CORE_H
#define GHC_GH200CORE_H

#include <gh200core/core.h>
#include <gh200core/plugin.h>
#include <gh200core/run.h>
#include <gh200core/mempolicy.h>
#include <gh200core/backend.h>
#include <gh200core/cache.h>
#include <gh200core/model.h>
#include <gh200core/network.h>
#include <gh200core/optimizer.h>
#include <gh200core/scheduler.h>
#include <gh200core/dataset.h>
#include <gh200core/media.h>
#include <gh200core/encoder.h>

#endif /* GHC_GH200CORE_H */
