package markdown

import (
	"fmt"
	"reflect"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestCodeSpans(t *testing.T) {
	md := "Run `berth stats` and `berth jobs -since 1h`.\n\n```sh\nberth dlq list billing\n# a comment\n```\nNot `closed\n"
	want := []string{"berth stats", "berth jobs -since 1h", "berth dlq list billing", "# a comment"}
	if got := CodeSpans(md); !reflect.DeepEqual(got, want) {
		t.Errorf("CodeSpans = %q, want %q", got, want)
	}
}

func ExampleCodeSpans() {
	fmt.Printf("%q\n", CodeSpans("Watch `berth_queue_depth` with `berth stats -watch`."))
	// Output: ["berth_queue_depth" "berth stats -watch"]
}
