// ClientConnection: whether the client of a request being served is still connected, for a
// non-streamed completion, which writes nothing until its end and so cannot learn of a closed
// connection by a failed write (a stream does). The front checks it between tokens and cancels
// the generation of a client that went away, freeing the worker's state.
//
// httplib (0.11) does not hand the connection's socket to handlers: it is found among the
// process's descriptors by its two addresses, which the request carries. The socket stays open
// while the handler runs (httplib closes it after), so the descriptor cannot be reused meanwhile.
//
// Thread-compatible; used by the thread serving the request.
#ifndef K3SERVE_HTTP_FRONT_CLIENT_CONNECTION_H_
#define K3SERVE_HTTP_FRONT_CLIENT_CONNECTION_H_

#include "httplib.h"

namespace k3 {

class ClientConnection {
 public:
  // Finds the request's socket; when it cannot (an unusual address), Gone() stays false.
  explicit ClientConnection(const httplib::Request& request);

  // True once the client closed or reset the connection (what is left to read does not count:
  // a client may pipeline its next request).
  bool Gone() const;

 private:
  int fd_ = -1;
};

}  // namespace k3

#endif  // K3SERVE_HTTP_FRONT_CLIENT_CONNECTION_H_
