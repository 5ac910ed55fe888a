// ApiError: a request the server refuses, as OpenAI reports it:
//   HTTP <status>  {"error": {"message": ..., "type": "invalid_request_error", "param": "max_tokens", "code": null}}
#pragma once
#include <string>

#include "dscpp/core/check.h"

namespace dscpp::serve {

struct ApiError : Error {
  ApiError(int status, std::string param, const std::string& message, std::string type = "invalid_request_error")
      : Error(message), status(status), param(std::move(param)), type(std::move(type)) {}
  int status;         // 400, 404, 413, 503
  std::string param;  // the request's field at fault ("" = none: JSON null)
  std::string type;
};

// The JSON body of an error response.
std::string error_body(const ApiError& e);

}  // namespace dscpp::serve
