package yamlfile

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// UnmarshalStrictJSON decodes data, a file an operator wrote in JSON,
// into v, as strictly as JSON itself: anything JSON does not allow (a
// trailing comma, a comment, a single-quoted string, a key without
// quotes) is an error saying "line L, column C: ..." where it is, and so
// is a key given twice in one object (encoding/json would keep the last
// without a word). It returns ErrNoDocument for a file with nothing in it
// (or only null), ErrSeveralDocuments (with its line and column) for
// anything after the first value but white space, and what ExactKeys
// returns for a key that names no field, a key in another case than its
// field's or a value its field does not take.
func UnmarshalStrictJSON(data []byte, v any) error {
	data = bytes.TrimPrefix(data, utf8BOM)
	if err := checkJSONSyntax(data); err != nil {
		return err
	}
	if err := ExactKeys(data, v); err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	return nil
}

// checkJSONSyntax walks data's tokens and returns nil when data is one
// JSON value (not null) with no key given twice in an object, else the
// error saying where it is not.
func checkJSONSyntax(data []byte) error {
	if len(bytes.TrimSpace(data)) == 0 || string(bytes.TrimSpace(data)) == "null" {
		return ErrNoDocument
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	// keys holds, for each object open around the current token, the keys
	// read so far; nil for an open list.
	var keys []map[string]bool
	expectKey := false // the next token in the innermost object is a key
	for {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if err == io.EOF {
			if len(keys) > 0 {
				return fmt.Errorf("%s: the file ends inside a JSON value: a } or ] is missing", position(data, len(data)))
			}
			return nil
		}
		if err != nil {
			return jsonSyntaxError(data, err)
		}
		inObject := len(keys) > 0 && keys[len(keys)-1] != nil
		if key, isKey := tok.(string); inObject && expectKey && isKey {
			// In an object, where a key is due, Token returns the key
			// (or the closing }, handled below).
			if keys[len(keys)-1][key] {
				return fmt.Errorf("%s: key %q given twice in one object: keep one", position(data, valueStart(data, int(before))), key)
			}
			keys[len(keys)-1][key] = true
			expectKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			keys = append(keys, map[string]bool{})
			expectKey = true
			continue
		case json.Delim('['):
			keys = append(keys, nil)
		case json.Delim('}'), json.Delim(']'):
			keys = keys[:len(keys)-1]
		}
		// After a value (or an opened list, or a closed value), an
		// enclosing object wants its next key.
		expectKey = len(keys) > 0 && keys[len(keys)-1] != nil
		if len(keys) == 0 {
			// The first value is complete: what follows must be blank.
			return checkNothingAfter(data, valueStart(data, int(dec.InputOffset())))
		}
	}
}

// checkNothingAfter returns nil when data ends at end, the end of its
// first value, but for white space; else ErrSeveralDocuments for a second
// value there, or the syntax error of what is there (a comment).
func checkNothingAfter(data []byte, end int) error {
	if end >= len(data) {
		return nil
	}
	if _, err := json.NewDecoder(bytes.NewReader(data[end:])).Token(); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return fmt.Errorf("%s: after the JSON value: %v", position(data, end+offendingByte(data[end:], syntax)), err)
		}
	}
	return fmt.Errorf("%s: %w", position(data, end), ErrSeveralDocuments)
}

// jsonSyntaxError says where in data err, a json.Decoder's error, is
// and, for a comma before a closing } or ], that JSON allows no trailing
// comma (the mistake YAML would have let through).
func jsonSyntaxError(data []byte, err error) error {
	var syntax *json.SyntaxError
	if !errors.As(err, &syntax) {
		return err
	}
	at := offendingByte(data, syntax)
	if at >= len(data) {
		return fmt.Errorf("%s: the file ends inside a JSON value: %v", position(data, len(data)), err)
	}
	hint := ""
	if c := data[at]; c == '}' || c == ']' {
		if prev := bytes.TrimRight(data[:at], " \t\r\n"); len(prev) > 0 && prev[len(prev)-1] == ',' {
			hint = fmt.Sprintf(" (a comma before %c: JSON allows no trailing comma)", c)
		}
	}
	return fmt.Errorf("%s: %v%s", position(data, at), err, hint)
}

// offendingByte returns the offset in data of the byte syntax, a
// Decoder's error on data, names: the Decoder gives the offset before it
// for some errors (those of Token) and after it for others (those of its
// scanner), so the byte before the offset is taken when it is the one
// the message names ("invalid character 'a' ...").
func offendingByte(data []byte, syntax *json.SyntaxError) int {
	at := int(syntax.Offset)
	if at > 0 && at <= len(data) && strings.HasPrefix(syntax.Error(), "invalid character "+quotedByte(data[at-1])) {
		return at - 1
	}
	return at
}

// quotedByte is c as encoding/json quotes it in a SyntaxError.
func quotedByte(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}

// valueStart returns the offset of the first byte at or after offset in
// data that is neither white space nor the comma or colon before a value.
func valueStart(data []byte, offset int) int {
	for offset < len(data) && bytes.IndexByte([]byte(" \t\r\n,:"), data[offset]) >= 0 {
		offset++
	}
	return offset
}

// position is "line L, column C" of the byte at offset in data, both
// counted from 1, the column in characters.
func position(data []byte, offset int) string {
	if offset > len(data) {
		offset = len(data)
	}
	before := data[:offset]
	line := bytes.Count(before, []byte("\n")) + 1
	column := utf8.RuneCount(before[bytes.LastIndexByte(before, '\n')+1:]) + 1
	return fmt.Sprintf("line %d, column %d", line, column)
}
