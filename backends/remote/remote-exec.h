/*
 * backends/remote/remote-exec.h — the server side of the remote tensor protocol: what a remote
 * tensor session owns on its device, and running its messages against it. Internal to libkiln
 * (kiln__ names, not exported by the shared library) and documented here for kilnd, whose
 * api/tensor-session.c keeps only the WebSocket transport and calls this from a session's
 * device worker; so does the fuzz target (tests/fuzz/fuzz_remote.c) with arbitrary bytes. The
 * remote backend (remote.c) is the client side; both speak wire.h.
 *
 * Every id, dtype, shape, stride, offset and length in a message is checked against the
 * session's own table before the backend sees it: the backend interface (backends/backend.h)
 * trusts its caller, so each primitive's preconditions are re-established here from untrusted
 * input — operand shapes by kiln_wire_op_check_shapes, then ids, views inside their buffers
 * (overflow-checked, negative and zero strides included), index values inside the dim they
 * index, and the session's quotas. A message that breaks a rule changes nothing and is answered
 * with an ERROR carrying its sequence number; the session goes on.
 *
 * Thread affinity: a state is used by one thread at a time (its device's worker).
 */
#ifndef KILN_REMOTE_EXEC_H
#define KILN_REMOTE_EXEC_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/tensor.h"
#include "wire.h"

struct kiln__tstate_limits {
    uint64_t max_live_bytes;
    uint64_t max_ids;
    uint64_t max_data_bytes; /* the longest DOWNLOAD (one DATA reply); 0: no limit */
};

struct kiln__tstate;

/* version is the protocol version the session negotiated. NULL when out of memory. */
struct kiln__tstate *kiln__tstate_new(const struct kiln__tstate_limits *lim, uint16_t version);

/*
 * Runs every protocol message of one WebSocket message on dev, in order; replies (DATA,
 * SYNC_DONE, ERROR) are appended to replies. Returns 0, or -1 when the message's framing is
 * unusable (the caller closes the connection; the messages before the bad one did run).
 */
int kiln__tstate_exec(struct kiln__tstate *st, kiln_device *dev, const uint8_t *msg, size_t len,
                      kiln_wire_buf *replies);

/* Frees every buffer the session holds (on the device it ran on), then the state. */
void kiln__tstate_free(struct kiln__tstate *st);

uint64_t kiln__tstate_live_bytes(const struct kiln__tstate *st);
/* Bit d set: dev stores and computes kiln_dtype d (the WELCOME's dtype mask). */
uint32_t kiln__tstate_dtype_mask(const kiln_device *dev);
uint64_t kiln__tstate_ids(const struct kiln__tstate *st);

#endif /* KILN_REMOTE_EXEC_H */
