package doctor_test

import (
	"context"
	"fmt"

	"github.com/berthq/berth/brokers/memory"
	"github.com/berthq/berth/doctor"
)

// Run checks a broker against the Workers the options describe; here a
// memory broker whose poison cap (3) is below the Workers' MaxAttempts (5).
// On RabbitMQ, SQS and PostgreSQL it also reads the queues and the job table.
func ExampleRun() {
	b, _ := memory.New(memory.Options{MaxDeliveries: 3})
	defer b.Close()
	fs, err := doctor.Run(context.Background(), b, doctor.Options{MaxAttempts: 5})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range fs {
		fmt.Println(f.Severity, f.ID)
	}
	fmt.Println("worst:", doctor.Worst(fs))
	// Output:
	// warn worker.max-attempts-over-broker-cap
	// info broker.checks
	// ok worker.drain-over-grace-period
	// worst: warn
}
