package server

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// protoCodec is Connect's binary protobuf codec with two differences. Unknown fields are
// dropped as a request is read, unless keepUnknown: a service that keeps requests in
// columns has nowhere to store them, and an answer built from a request must not echo
// them. A string that is not UTF-8 is refused naming its path in the request, such as
// "events[3].reason", where protobuf's decoder names no field.
type protoCodec struct {
	// keepUnknown keeps the fields a request's schema does not name, for a service that
	// stores what a newer client sends as it was sent (KeepUnknownFields).
	keepUnknown bool
}

// KeepUnknownFields is a handler option, for Handle, that keeps the fields of a request
// its schema does not name instead of dropping them: a service older than its clients
// then stores and serves back what a newer client sent. The message's bound
// (Config.MaxMessageBytes) bounds them.
func KeepUnknownFields() connect.HandlerOption {
	return connect.WithCodec(protoCodec{keepUnknown: true})
}

var _ connect.Codec = protoCodec{}

// Name stands in for connect's own "proto" codec.
func (protoCodec) Name() string { return "proto" }

func (protoCodec) IsBinary() bool { return true }

func (c protoCodec) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

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

func (c protoCodec) Unmarshal(data []byte, m any) error {
	msg, err := protoMessage(m)
	if err != nil {
		return err
	}
	err = proto.UnmarshalOptions{DiscardUnknown: !c.keepUnknown}.Unmarshal(data, msg)
	if err == nil {
		return nil
	}
	// Only bad requests pay for the second pass.
	if path, found := invalidUTF8Path(data, msg.ProtoReflect().Descriptor()); found {
		return errors.New(path + ": not valid UTF-8")
	}
	return fmt.Errorf("unmarshal into %T: %w", m, err)
}

func protoMessage(m any) (proto.Message, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return msg, nil
}

// invalidUTF8Path finds the first string that is not UTF-8 in data, a message of type md,
// and returns its path, such as "events[0].reason".
func invalidUTF8Path(data []byte, md protoreflect.MessageDescriptor) (string, bool) {
	seen := map[protoreflect.FieldNumber]int{} // elements of each repeated field so far
	for len(data) > 0 {
		num, typ, n := protowire.ConsumeTag(data)
		if n < 0 {
			return "", false
		}
		data = data[n:]
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			if n = protowire.ConsumeFieldValue(num, typ, data); n < 0 {
				return "", false
			}
			data = data[n:]
			continue
		}
		value, n := protowire.ConsumeBytes(data)
		if n < 0 {
			return "", false
		}
		data = data[n:]
		name := string(fd.Name())
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, seen[num])
			seen[num]++
		}
		switch {
		case fd.Kind() == protoreflect.StringKind && !utf8.Valid(value):
			return name, true
		case fd.Kind() == protoreflect.MessageKind && !fd.IsMap():
			if inner, found := invalidUTF8Path(value, fd.Message()); found {
				return name + "." + inner, true
			}
		}
	}
	return "", false
}
