#ifndef ASYNCPS_COMMON_REQUEST_GUARD_H_
#define ASYNCPS_COMMON_REQUEST_GUARD_H_

// Bounds what callers can make the process's gRPC servers hold in requests
// they never finish.
//
// gRPC (1.51) opens a stream's flow-control window to the size a message's
// length prefix announces, whatever the server's maximum message size, and
// keeps what arrives until all of it has, before any handler or size check
// runs. Calls that announce large messages and never finish them take as
// much memory as their sender sends: 4 connections of 200 such calls took
// a shard's health port (4 KiB requests at most, behind a 16 MiB gRPC
// memory quota) to 2.8 GB in 8 s, ps_serve from 27 MB to 1.8 GB, a shard
// without a cluster token likewise.
//
// This library defines recvmsg(), sendmsg() and close() for the process
// (the symbols gRPC's endpoints call, ahead of libc's; link it into servers
// only, alwayslink), and OpenSSL's SSL_read(), SSL_write() and SSL_free()
// for a port that speaks TLS. On connections accepted on a guarded port it
// reads the bytes gRPC receives and sends (their plaintext, under TLS)
// through a CallLedger (common/call_ledger.h):
// when the calls of all of a port's connections hold more than its budget,
// the connection holding the most is shut down (gRPC reads its end and
// frees what it held). A connection whose client resets more than 1000
// calls within a second is shut down too: gRPC 1.51 does the work of every
// call opened ("rapid reset", CVE-2023-44487; two connections doing so
// made 1000 pushes of another client take 26 s instead of 0.6 s and the
// shard hold 1.7 GB), and so is one whose header block (HEADERS and the
// CONTINUATION frames after it) passes 256 KiB or 32 frames: gRPC keeps
// reading them into one block (3.4 GB in 8 s from one connection), copying
// it once per frame (CVE-2023-33953: 1-byte frames kept a core and a half
// busy for 12 s), and so is one that
// sends more than 10000 frames within a second that do no call's work
// (WINDOW_UPDATE, PING, SETTINGS, PRIORITY, empty DATA...) beyond four per
// frame that does: gRPC parses each, and one connection sending 12 million
// a second kept a core busy for as long as it went on. Other descriptors
// pass through with one atomic load.

#include <cstdint>

namespace asyncps {

// Guards connections on local TCP port `port` (those that read before too),
// with `max_bytes` for what their unfinished calls hold together. A port
// given again gets the new budget. At most 8 ports.
//
// `tls`: the port's connections speak TLS, so the bytes recvmsg() sees are
// ciphertext; the ledger reads what SSL_read() and SSL_write() pass on the
// server side of TLS connections instead (this library defines those too),
// and a cut connection's next SSL_read() fails. One TLS port per process
// (server-side TLS connections cannot be told apart by port there). A
// connection on a plain port whose client does not begin with the HTTP/2
// preface (e.g. a TLS handshake) passes through unread.
void GuardUnfinishedRequests(int port, int64_t max_bytes, bool tls = false);

struct UnfinishedRequestStats {
  int64_t pending_bytes = 0;      // held now, all guarded ports together
  uint64_t connections_shut = 0;  // for holding the most past a budget
  uint64_t floods_shut = 0;       // resets, idle frames, header blocks
};
UnfinishedRequestStats UnfinishedRequests();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_REQUEST_GUARD_H_
