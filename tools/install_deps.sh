#!/usr/bin/env bash
# Installs the Debian 12 packages k3serve builds with, if any is missing. Needs root (or sudo).
# Everything else (CUDA, NCCL) is optional and found under /usr/local/cuda when present.
set -euo pipefail

packages=(
  bazel-bootstrap g++ pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libgoogle-glog-dev libgflags-dev libgtest-dev libgmock-dev
  libucx-dev ucx-utils libdnnl-dev
  libcli11-dev nlohmann-json3-dev libcpp-httplib-dev libpcre2-dev python3-regex
  python3-jsonschema  # checks constrained decoding (tokenizer:json_grammar_test, tests:http_front_test)
  iproute2 procps openssl
  python3 curl  # tools/demo.sh asks the HTTP front with curl and reads its events with python3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the tests' references (the official `openai` client in tests/openai_client,
# js-tiktoken in tokenizer/reference, the k8s manifest validator). Checked as commands, not as
# packages: a machine with another Node.js build (NodeSource's bundles npm) keeps its own.
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing: ${missing[*]}" >&2
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
