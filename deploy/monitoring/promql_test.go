package monitoring

import (
	"fmt"
	"strings"
	"unicode"
)

// use is one metric named in a PromQL expression, with the function that
// directly encloses it ("" when none).
type use struct {
	metric string
	fn     string
}

// parsed is what scanPromQL found in an expression.
type parsed struct {
	uses   []use
	labels []string // label names in matchers and by/without/on/ignoring/group_* lists
	funcs  []string // functions and aggregation operators called
}

// aggregations are PromQL's aggregation operators, which may be followed by
// a by/without clause before their parenthesis.
var aggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true,
}

// functions are the PromQL functions the dashboard and rules may call; an
// unknown one is a typo (or a function this Prometheus lacks).
var functions = map[string]bool{
	"rate": true, "irate": true, "increase": true, "delta": true, "idelta": true, "deriv": true,
	"histogram_quantile": true, "clamp_min": true, "clamp_max": true, "abs": true, "absent": true,
	"absent_over_time": true, "avg_over_time": true, "max_over_time": true, "min_over_time": true,
	"sum_over_time": true, "quantile_over_time": true, "changes": true, "resets": true, "vector": true,
	"scalar": true, "time": true, "timestamp": true, "sort": true, "sort_desc": true, "round": true,
	"label_replace": true, "predict_linear": true, "last_over_time": true, "present_over_time": true,
}

// keywords are PromQL words that are neither metrics nor functions.
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"inf": true, "nan": true, "start": true, "end": true,
}

// labelLists introduce a parenthesised list of label names.
var labelLists = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
}

// scanPromQL finds the metric names, label names and functions of a PromQL
// expression. It is a scanner, not a parser: Prometheus itself (promtool)
// checks the syntax where it is installed; this finds the names whatever
// the machine has, which is what must match berth's exports. Grafana
// variables ($queue, ${queue}, $__rate_interval) are skipped.
func scanPromQL(expr string) (parsed, error) {
	var p parsed
	var stack []string // the function of each open parenthesis
	pending := ""      // a function or aggregation waiting for its parenthesis
	s := []rune(expr)
	i := 0
	skipSpace := func() {
		for i < len(s) && unicode.IsSpace(s[i]) {
			i++
		}
	}
	ident := func() string {
		j := i
		for i < len(s) && (s[i] == '_' || s[i] == ':' || unicode.IsLetter(s[i]) || (i > j && unicode.IsDigit(s[i]))) {
			i++
		}
		return string(s[j:i])
	}
	str := func() (string, error) { // at a quote
		q := s[i]
		i++
		var b strings.Builder
		for i < len(s) && s[i] != q {
			if s[i] == '\\' && q != '`' && i+1 < len(s) {
				i++
			}
			b.WriteRune(s[i])
			i++
		}
		if i >= len(s) {
			return "", fmt.Errorf("unterminated string in %q", expr)
		}
		i++
		return b.String(), nil
	}
	for i < len(s) {
		c := s[i]
		switch {
		case unicode.IsSpace(c):
			i++
		case c == '"' || c == '\'' || c == '`':
			if _, err := str(); err != nil {
				return p, err
			}
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				for i < len(s) && s[i] != '}' {
					i++
				}
				i++
			} else {
				ident()
			}
		case c == '[':
			for i < len(s) && s[i] != ']' {
				i++
			}
			if i >= len(s) {
				return p, fmt.Errorf("unterminated [ in %q", expr)
			}
			i++
		case c == '{':
			i++
			for {
				skipSpace()
				if i >= len(s) {
					return p, fmt.Errorf("unterminated { in %q", expr)
				}
				if s[i] == '}' {
					i++
					break
				}
				if s[i] == ',' {
					i++
					continue
				}
				name := ident()
				if name == "" {
					return p, fmt.Errorf("bad label matcher at %q in %q", string(s[i:]), expr)
				}
				skipSpace()
				op := ""
				for i < len(s) && strings.ContainsRune("=!~", s[i]) {
					op += string(s[i])
					i++
				}
				skipSpace()
				if op == "" || i >= len(s) || !strings.ContainsRune("\"'`", s[i]) {
					return p, fmt.Errorf("bad matcher for %s in %q", name, expr)
				}
				v, err := str()
				if err != nil {
					return p, err
				}
				if name == "__name__" && op == "=" {
					p.uses = append(p.uses, use{metric: v, fn: top(stack)})
				} else {
					p.labels = append(p.labels, name)
				}
			}
		case c == '(':
			stack = append(stack, pending)
			pending = ""
			i++
		case c == ')':
			if len(stack) == 0 {
				return p, fmt.Errorf("unbalanced ) in %q", expr)
			}
			stack = stack[:len(stack)-1]
			i++
		case unicode.IsDigit(c) || (c == '.' && i+1 < len(s) && unicode.IsDigit(s[i+1])):
			for i < len(s) && (unicode.IsDigit(s[i]) || unicode.IsLetter(s[i]) || s[i] == '.') {
				i++
			}
		case c == '_' || c == ':' || unicode.IsLetter(c):
			name := ident()
			j := i
			skipSpace()
			next := rune(0)
			if i < len(s) {
				next = s[i]
			}
			i = j
			lower := strings.ToLower(name)
			switch {
			case labelLists[lower]:
				skipSpace()
				if i < len(s) && s[i] == '(' {
					i++
					for {
						skipSpace()
						if i >= len(s) {
							return p, fmt.Errorf("unterminated %s ( in %q", name, expr)
						}
						if s[i] == ')' {
							i++
							break
						}
						if s[i] == ',' {
							i++
							continue
						}
						l := ident()
						if l == "" {
							return p, fmt.Errorf("bad label list after %s in %q", name, expr)
						}
						p.labels = append(p.labels, l)
					}
				}
			case keywords[lower]:
			case aggregations[lower] || next == '(':
				p.funcs = append(p.funcs, name)
				pending = name
			default:
				p.uses = append(p.uses, use{metric: name, fn: top(stack)})
			}
		default: // operators, commas
			i++
		}
	}
	if len(stack) != 0 {
		return p, fmt.Errorf("unbalanced ( in %q", expr)
	}
	return p, nil
}

func top(stack []string) string {
	if len(stack) == 0 {
		return ""
	}
	return stack[len(stack)-1]
}
