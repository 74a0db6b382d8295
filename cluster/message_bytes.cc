#include "cluster/message_bytes.h"

#include <utility>

namespace k3 {

MessageBytes MessageBytes::Lent(const char* data, size_t size,
                                absl::AnyInvocable<void() &&> give_back) {
  MessageBytes bytes;
  bytes.lent_ = true;
  bytes.lent_data_ = data;
  bytes.lent_size_ = size;
  bytes.give_back_ = std::move(give_back);
  return bytes;
}

MessageBytes::MessageBytes(MessageBytes&& other) noexcept
    : owned_(std::move(other.owned_)),
      lent_(std::exchange(other.lent_, false)),
      lent_data_(std::exchange(other.lent_data_, nullptr)),
      lent_size_(std::exchange(other.lent_size_, 0)),
      give_back_(std::move(other.give_back_)) {
  other.owned_.clear();
}

MessageBytes& MessageBytes::operator=(MessageBytes&& other) noexcept {
  if (this == &other) return *this;
  GiveBack();
  owned_ = std::move(other.owned_);
  other.owned_.clear();
  lent_ = std::exchange(other.lent_, false);
  lent_data_ = std::exchange(other.lent_data_, nullptr);
  lent_size_ = std::exchange(other.lent_size_, 0);
  give_back_ = std::move(other.give_back_);
  return *this;
}

std::string MessageBytes::TakeString() && {
  if (!lent_) return std::move(owned_);
  std::string copy(lent_data_, lent_size_);
  GiveBack();
  return copy;
}

void MessageBytes::GiveBack() {
  if (!lent_) return;
  lent_ = false;
  lent_data_ = nullptr;
  lent_size_ = 0;
  if (give_back_) std::move(give_back_)();
  give_back_ = nullptr;
}

}  // namespace k3
