-- bench/serving/infer.lua — wrk script: POST the body in $KILN_WRK_BODY (a file) to the URL's path
-- on every request, as JSON. The body is read once; every request sends the same bytes.
local f = assert(io.open(os.getenv("KILN_WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
