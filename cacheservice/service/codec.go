package service

import (
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/flytekube/backend/gen/go/flyte/cache/v1/cachev1connect"
)

// NewHandler returns the service's HTTP path and handler, with opts (the server's) and
// the service's own binary codec.
func NewHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	return cachev1connect.NewCacheServiceHandler(s, append(opts, connect.WithCodec(protoCodec{}))...)
}

// protoCodec is Connect's binary protobuf codec with two differences. Unknown fields
// are dropped as a request is read: nothing of the cache keeps them, and an answer
// built from a request must not echo them. A string that is not UTF-8 is refused
// naming its field, where the generated decoder says only "string field contains
// invalid UTF-8".
type protoCodec struct{}

var _ connect.Codec = protoCodec{}

func (protoCodec) Name() string { return "proto" }

func (protoCodec) IsBinary() bool { return true }

func (protoCodec) Marshal(m any) ([]byte, error) { return protoCodec{}.MarshalAppend(nil, m) }

func (protoCodec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	msg, err := protoMessage(m)
	if err != nil {
		return nil, err
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, msg)
}

func (protoCodec) MarshalStable(m any) ([]byte, error) {
	msg, err := protoMessage(m)
	if err != nil {
		return nil, err
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(msg)
}

func (protoCodec) Unmarshal(data []byte, m any) error {
	msg, err := protoMessage(m)
	if err != nil {
		return err
	}
	err = proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(data, msg)
	var utf8Err interface{ InvalidUTF8() bool }
	if errors.As(err, &utf8Err) && utf8Err.InvalidUTF8() {
		// A dynamic message has no generated decoder, so protobuf's reflective one reads it
		// and names the field it fails on. Only bad requests pay for the second read.
		if named := proto.Unmarshal(data, dynamicpb.NewMessage(msg.ProtoReflect().Descriptor())); named != nil {
			err = named
		}
	}
	if err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

func protoMessage(m any) (proto.Message, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return msg, nil
}
