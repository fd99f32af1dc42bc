-- bench/serving/infer_binary.lua — wrk script: POST the body in $KILN_WRK_BODY (a file) to the URL's
-- path on every request as a KServe v2 binary tensor request: the body is a JSON header of
-- $KILN_WRK_HEADER_LEN bytes followed by the raw tensor bytes, and the header length goes in
-- Inference-Header-Content-Length. The body is read once; every request sends the same bytes.
local f = assert(io.open(os.getenv("KILN_WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/octet-stream"
wrk.headers["Inference-Header-Content-Length"] = assert(os.getenv("KILN_WRK_HEADER_LEN"))
