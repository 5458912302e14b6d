// Preloaded (node --require) into the provider framework's process in the tests. CloudFormation's
// pre-signed response URLs name no port, and the framework's PUT (outbound.httpRequest) passes
// only hostname and path to https.request, so it always connects to 443. The tests' response
// server cannot listen there; this sends requests for TEST_RESPONSE_HOST to TEST_RESPONSE_PORT.
// Nothing else of the request changes: method, path, headers and body are the framework's.
"use strict";
const https = require("https");

const host = process.env.TEST_RESPONSE_HOST;
const port = Number(process.env.TEST_RESPONSE_PORT);
const request = https.request;
https.request = function (options, ...rest) {
  if (host && typeof options === "object" && options.hostname === host && !options.port) {
    options = { ...options, port };
  }
  return request.call(this, options, ...rest);
};
