package api

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// splitText keeps every piece within the bound and every rune whole, and loses nothing.
func TestSplitText(t *testing.T) {
	for _, s := range []string{"", "abc", strings.Repeat("é", 10), strings.Repeat("x", 9) + "日本語", strings.Repeat("🙂", 7)} {
		for _, n := range []int{4, 5, 7, 100} {
			parts := splitText(s, n)
			if strings.Join(parts, "") != s {
				t.Fatalf("%q by %d: %q", s, n, parts)
			}
			for _, p := range parts {
				if len(p) > n || !utf8.ValidString(p) {
					t.Fatalf("%q by %d: piece %q", s, n, p)
				}
			}
		}
	}
}
