// Package jsondepth measures how deeply a JSON document nests arrays and objects, so that the
// request decoders of the native API (internal/api) and the E2B routes (internal/e2b) refuse a
// body nested past Max before decoding it: encoding/json recurses per level, and a megabyte of
// '[' would otherwise cost a deep stack per request.
package jsondepth

// Max is the deepest nesting a request body may have. The deepest request either API defines
// nests 4 levels.
const Max = 32

// Of returns the deepest nesting of arrays and objects in b, outside strings. It does not
// validate b: for valid JSON it is exact, and invalid JSON the decoder refuses anyway.
func Of(b []byte) int {
	depth, most := 0, 0
	inString, escaped := false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			depth++
			most = max(most, depth)
		case c == ']' || c == '}':
			depth--
		}
	}
	return most
}
