package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/berthq/berth/doctor"
)

// errDoctorFindings is returned by "berth doctor" when a finding is an
// error; the findings are printed already, so it exits 1 without a message.
var errDoctorFindings = errors.New("doctor: a finding is an error")

type jsonDoctor struct {
	Findings []doctor.Finding `json:"findings"`
	Worst    doctor.Severity  `json:"worst"`
	Errors   int              `json:"errors"`
	Warnings int              `json:"warnings"`
}

func runDoctor(ctx context.Context, c *cli, args []string) error {
	if c.maxAttempts < 0 || c.concurrency < 0 {
		return usagef("-max-attempts and -concurrency must not be negative")
	}
	b, err := c.broker(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	opts := doctor.Options{Queues: args, MaxAttempts: c.maxAttempts, LongestJob: c.longestJob, Concurrency: c.concurrency}
	if u, err := url.Parse(c.url); err == nil { // the workers' RabbitMQ prefetch, from the URL they use
		if p, err := strconv.Atoi(u.Query().Get("prefetch")); err == nil {
			opts.Prefetch = p
		}
	}
	fs, err := doctor.Run(ctx, b, opts)
	if errors.Is(err, doctor.ErrNoQueues) {
		return usagef("this broker cannot list its queues: name them (berth doctor QUEUE...)")
	}
	if err != nil {
		return err
	}
	var errs, warns int
	for _, f := range fs {
		switch f.Severity {
		case doctor.Error:
			errs++
		case doctor.Warn:
			warns++
		}
	}
	if c.json {
		if err := writeJSON(c.stdout, jsonDoctor{Findings: fs, Worst: doctor.Worst(fs), Errors: errs, Warnings: warns}); err != nil {
			return err
		}
	} else {
		c.printFindings(fs, errs, warns)
	}
	if errs > 0 {
		return errDoctorFindings
	}
	return nil
}

// ANSI colours of the severities, used only when stdout is a terminal.
var severityColour = map[doctor.Severity]string{
	doctor.Error: "\x1b[1;31m", doctor.Warn: "\x1b[33m", doctor.Info: "\x1b[36m", doctor.OK: "\x1b[32m",
}

func (c *cli) printFindings(fs []doctor.Finding, errs, warns int) {
	w := c.stdout
	for _, f := range fs {
		label := fmt.Sprintf("%-5s", f.Severity)
		if c.colour {
			label = severityColour[f.Severity] + label + "\x1b[0m"
		}
		where := ""
		if f.Queue != "" {
			where = "  " + esc(f.Queue)
		}
		fmt.Fprintf(w, "%s  %s%s: %s\n", label, esc(f.ID), where, esc(f.Summary))
		if f.Severity == doctor.OK {
			continue
		}
		if f.Evidence != "" {
			fmt.Fprintf(w, "       evidence: %s\n", esc(f.Evidence))
		}
		if f.Fix != "" {
			fmt.Fprintf(w, "       fix: %s\n", esc(f.Fix))
		}
	}
	fmt.Fprintf(w, "%d checks: %d errors, %d warnings\n", len(fs), errs, warns)
}
