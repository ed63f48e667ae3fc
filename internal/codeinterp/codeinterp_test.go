package codeinterp

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// The wire's line shapes (../shared/E2B-CODE-INTERPRETER.md §4) as events.
func TestParseLine(t *testing.T) {
	cases := []struct {
		line string
		want Event
		ok   bool
	}{
		{`{"type":"stdout","text":"hi\n","timestamp":"2026-01-01T00:00:00Z"}`, Event{Kind: "stdout", Text: "hi\n"}, true},
		{`{"type":"stderr","text":"err\n"}`, Event{Kind: "stderr", Text: "err\n"}, true},
		{`{"type":"result","is_main_result":true,"text":"42","extra":{}}`,
			Event{Kind: "result", Result: &Result{IsMain: true, Data: map[string]any{"text/plain": "42"}}}, true},
		{`{"type":"result","is_main_result":false,"png":"iVBORw0KGgo=","text":"<Figure>","json":{"a":[1,2]},"extra":{"application/vnd.custom":"x"}}`,
			Event{Kind: "result", Result: &Result{Data: map[string]any{"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>",
				"application/json": map[string]any{"a": []any{1.0, 2.0}}, "application/vnd.custom": "x"}}}, true},
		{`{"type":"result","html":null,"text":"x"}`, Event{Kind: "result", Result: &Result{Data: map[string]any{"text/plain": "x"}}}, true},
		{`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback…"}`,
			Event{Kind: "error", Error: &ExecError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "Traceback…"}}, true},
		{`{"type":"number_of_executions","execution_count":3}`, Event{Kind: "count", ExecutionCount: 3}, true},
		{`{"type":"kernel_restarted","reason":"restored from a file snapshot"}`, Event{Kind: "kernel_restarted", Text: "restored from a file snapshot"}, true},
		{`{"type":"keepalive"}`, Event{}, false},
		{`{"type":"end_of_execution"}`, Event{}, false},
		{`{"type":"something-new","x":1}`, Event{}, false},
		// The server's own field cannot be overwritten by extra.
		{`{"type":"result","text":"real","extra":{"text/plain":"forged"}}`, Event{Kind: "result", Result: &Result{Data: map[string]any{"text/plain": "real"}}}, true},
	}
	for _, c := range cases {
		got, ok, err := parseLine([]byte(c.line))
		if err != nil || ok != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v %v %v\nwant %+v %v", c.line, got, ok, err, c.want, c.ok)
		}
	}
	for _, bad := range []string{`not json`, `[1,2]`, `{"type":`, strings.Repeat("[", 20000)} {
		if _, _, err := parseLine([]byte(bad)); err == nil {
			t.Errorf("%.40s: no error", bad)
		}
	}
}

// FuzzParseLine: whatever a sandbox's server sends (it is the sandbox's to replace), a line
// gives an event, nothing, or an error; never a panic, and an event's fields are what the line
// said.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"type":"stdout","text":"hi\n"}`, `{"type":"result","is_main_result":true,"text":"42","png":"AA==","extra":{"k":1}}`,
		`{"type":"error","name":"E","value":"v","traceback":"t"}`, `{"type":"number_of_executions","execution_count":-1}`,
		`{"type":"result","json":[[[[]]]],"data":{"a":null}}`, `{"type":1}`, `null`, `"x"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		ev, ok, err := parseLine(line)
		if err != nil {
			if ok {
				t.Fatal("an error and an event")
			}
			return
		}
		if !ok {
			return
		}
		if ev.Kind == "result" {
			if ev.Result == nil || ev.Result.Data == nil {
				t.Fatal("a result without its bundle")
			}
			if _, err := json.Marshal(ev.Result); err != nil {
				t.Fatalf("the bundle does not encode: %v", err)
			}
		}
	})
}
