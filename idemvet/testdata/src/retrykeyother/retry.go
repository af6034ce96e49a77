package retrykeyother

import (
	"context"

	"github.com/IBM/sarama"
	"github.com/idemkit/idem/event"
	"github.com/segmentio/kafka-go"
)

func saramaRetry(p sarama.SyncProducer) {
	for attempt := 0; attempt < 3; attempt++ {
		id, _ := event.NewID() // want "idempotency key created inside a retry loop"
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "orders", Key: sarama.ByteEncoder(id[:])}); err == nil {
			return
		}
	}
}

func kafkaGoRetry(ctx context.Context, w *kafka.Writer) {
	for attempt := 0; attempt < 3; attempt++ {
		id, _ := event.NewID() // want "idempotency key created inside a retry loop"
		if err := w.WriteMessages(ctx, kafka.Message{Key: id[:]}); err == nil {
			return
		}
	}
}

// Not reported: the ID made once, before the loop.

func saramaOnce(p sarama.SyncProducer) {
	id, _ := event.NewID()
	for attempt := 0; attempt < 3; attempt++ {
		if _, _, err := p.SendMessage(&sarama.ProducerMessage{Topic: "orders", Key: sarama.ByteEncoder(id[:])}); err == nil {
			return
		}
	}
}
