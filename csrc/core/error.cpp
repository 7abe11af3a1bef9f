#include "error.h"

#include <cstring>

namespace rn {
namespace {

thread_local const OpContext* t_current_context = nullptr;

std::string where(const char* expr, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  std::string text = std::string(" in `") + expr + "` at " + (base ? base + 1 : file) + ":" + std::to_string(line);
  const std::string op = OpContext::current();
  if (!op.empty()) text += " during " + op;
  return text;
}

}  // namespace

OpContext::OpContext(Describe describe, const void* data)
    : describe_(describe), data_(data), outer_(t_current_context) {
  t_current_context = this;
}

OpContext::~OpContext() {
  t_current_context = outer_;
}

std::string OpContext::current() {
  const OpContext* ctx = t_current_context;
  return ctx ? ctx->describe_(ctx->data_) : std::string();
}

std::string cudnn_status_name(cudnnStatus_t status) {
  return cudnnGetErrorString(status);
}

std::string cudnn_last_error() {
  char buffer[1024] = {0};
  cudnnGetLastErrorString(buffer, sizeof(buffer));
  return buffer;
}

void throw_cudnn_error(cudnnStatus_t status, const char* expr, const char* file, int line) {
  std::string message = cudnn_status_name(status) + where(expr, file, line);
  const std::string last = cudnn_last_error();
  if (!last.empty()) message += ". cuDNN says: " + last;
  throw CudnnError(status, message);
}

void throw_cuda_error(cudaError_t code, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear the runtime's record of a non-sticky error: it is reported here, once
  std::string message =
      std::string(cudaGetErrorName(code)) + " (" + cudaGetErrorString(code) + ")" + where(expr, file, line);
  throw CudaError(code, message);
}

}  // namespace rn
