// ufab's RoCEv2 wire format, one include: opcodes, header codecs, ICRC,
// parser, builder, UDP source ports and GIDs. See docs/roce-wire.md.
#pragma once

#include "core/roce/builder.h"
#include "core/roce/gid.h"
#include "core/roce/headers.h"
#include "core/roce/icrc.h"
#include "core/roce/opcodes.h"
#include "core/roce/parser.h"
#include "core/roce/udp_port.h"
