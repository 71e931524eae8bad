package brokerurl

import "testing"

// TestEndpointRegion: the region of an AWS SQS endpoint is read from its
// host name, so that https://sqs.eu-west-1.amazonaws.com without ?region
// signs its requests for eu-west-1. It took the AWS configuration's region,
// else us-east-1: every request to such an endpoint was refused.
func TestEndpointRegion(t *testing.T) {
	for host, want := range map[string]string{
		"sqs.eu-west-1.amazonaws.com":                                      "eu-west-1",
		"SQS.US-EAST-2.AMAZONAWS.COM.":                                     "us-east-2",
		"sqs.cn-north-1.amazonaws.com.cn":                                  "cn-north-1",
		"vpce-0123456789abcdef-abcdefgh.sqs.ap-south-1.vpce.amazonaws.com": "ap-south-1",
		"eu-central-1.queue.amazonaws.com":                                 "eu-central-1",
		"sqs.amazonaws.com":                                                "",
		"127.0.0.1":                                                        "",
		"localhost":                                                        "",
		"sqs.eu-west-1.example.com":                                        "",
		"queue.amazonaws.com":                                              "",
	} {
		if got := endpointRegion(host); got != want {
			t.Errorf("endpointRegion(%q) = %q, want %q", host, got, want)
		}
	}
}
