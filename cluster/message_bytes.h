// The bytes of one received message. Either a std::string the holder owns, or a buffer a transport
// lends: UCX's receive buffer, read where UCX put it instead of copied out (ucx_transport.h), and
// handed back when the MessageBytes is destroyed or assigned over. Either way the bytes stay at one
// address for the MessageBytes' life, across moves, so pointers into them (DecodeInPlace's rows)
// stay valid while it lives.
//
// Move-only. Not thread-safe: one owner at a time (moving it to another thread is fine).
#ifndef K3SERVE_CLUSTER_MESSAGE_BYTES_H_
#define K3SERVE_CLUSTER_MESSAGE_BYTES_H_

#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>

#include "absl/functional/any_invocable.h"

namespace k3 {

class MessageBytes {
 public:
  MessageBytes() = default;
  // Owns `bytes`. Implicit, so a std::string is a message wherever one is expected.
  MessageBytes(std::string bytes) : owned_(std::move(bytes)) {}  // NOLINT(runtime/explicit)
  MessageBytes(const char* bytes) : owned_(bytes) {}              // NOLINT(runtime/explicit)

  // Borrows [data, data + size); `give_back` runs exactly once, when the borrow ends (destruction
  // or assignment), and must not throw.
  static MessageBytes Lent(const char* data, size_t size, absl::AnyInvocable<void() &&> give_back);

  MessageBytes(MessageBytes&& other) noexcept;
  MessageBytes& operator=(MessageBytes&& other) noexcept;
  MessageBytes(const MessageBytes&) = delete;
  MessageBytes& operator=(const MessageBytes&) = delete;
  ~MessageBytes() { GiveBack(); }

  const char* data() const { return lent_ ? lent_data_ : owned_.data(); }
  size_t size() const { return lent_ ? lent_size_ : owned_.size(); }
  bool empty() const { return size() == 0; }
  // Whether the bytes are a transport's buffer (for tests).
  bool lent() const { return lent_; }
  std::string_view view() const { return std::string_view(data(), size()); }
  operator std::string_view() const { return view(); }  // NOLINT(runtime/explicit)

  // The bytes as a string: the owned one moved out, or a copy of a lent buffer (returned at once).
  std::string TakeString() &&;

  friend bool operator==(const MessageBytes& a, std::string_view b) { return a.view() == b; }
  friend std::ostream& operator<<(std::ostream& os, const MessageBytes& bytes) {
    return os << bytes.view();
  }

 private:
  void GiveBack();

  std::string owned_;
  bool lent_ = false;
  const char* lent_data_ = nullptr;
  size_t lent_size_ = 0;
  absl::AnyInvocable<void() &&> give_back_;
};

}  // namespace k3

#endif  // K3SERVE_CLUSTER_MESSAGE_BYTES_H_
