// What the core calls in the tag-matching (tag.*) and connection-manager (cm.*) modules.
#pragma once

#include "cm.h"
#include "tag.h"
