package postgres

import "github.com/jackc/pgx/v5/pgxpool"

// Pool returns the pool the broker was made with (berth doctor reads the
// jobs table's statistics through it).
func (b *Broker) Pool() *pgxpool.Pool { return b.pool }
