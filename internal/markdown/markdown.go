// Package markdown reads what the repository's documents point at: the code
// spans and fenced code lines of a Markdown text, where RUNBOOK.md names
// metrics, commands and checks that tests then look up.
package markdown

import "strings"

// CodeSpans returns the inline code spans (between single backquotes) and
// the lines of fenced code blocks of md, in order. It is a reader for the
// repository's own documents, not a CommonMark parser: double backquotes
// and indented code blocks are not recognised.
func CodeSpans(md string) []string {
	var spans []string
	inFence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			spans = append(spans, line)
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts)-1; i += 2 { // an unclosed backquote opens no span
			spans = append(spans, parts[i])
		}
	}
	return spans
}
