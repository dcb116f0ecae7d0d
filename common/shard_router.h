#ifndef ASYNCPS_COMMON_SHARD_ROUTER_H_
#define ASYNCPS_COMMON_SHARD_ROUTER_H_

// Where each shard's primary can be reached now, for clients that follow a
// replicated run's shard map (PsClientOptions::router). The map itself lives
// in etcd (membership/map_router.h follows it); a client asks the router on
// every attempt of a call and moves to a new address when the router says
// the shard moved.
//
// Example (a client's check before an attempt):
//
//   const uint64_t g = router->generation();  // one atomic load
//   if (g != seen) {                          // something moved
//     seen = g;
//     for (int s = 0; s < router->num_shards(); ++s) {
//       const std::string a = router->Address(s);  // "" = none known now
//       if (!a.empty() && a != current[s]) { ... reconnect shard s ... }
//     }
//   }
//
// Implementations are thread-safe: Address and generation are called from
// any thread while the router updates itself.

#include <cstdint>
#include <string>

namespace asyncps {

class ShardRouter {
 public:
  virtual ~ShardRouter() = default;

  // The run's shard count; fixed for the router's life.
  virtual int num_shards() const = 0;

  // host:port of shard `shard`'s primary as last known; "" when none is
  // known now (the shard has no live primary: callers retry, backing off).
  // REQUIRES: 0 <= shard < num_shards().
  virtual std::string Address(int shard) const = 0;

  // Advanced whenever any address changes: a cheap check before comparing
  // strings. Never goes back.
  virtual uint64_t generation() const = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SHARD_ROUTER_H_
