package service

import (
	"errors"
	"fmt"
	"unicode/utf8"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Codec is the binary protobuf codec of the service's handlers. It differs from connect's
// own in what it says about a message it cannot read: a string that is not UTF-8 is
// named by its path (protobuf's error names no field), so the sender knows which one to
// fix.
type Codec struct{}

var _ connect.Codec = Codec{}

// Name is the codec's name in content types: it stands in for connect's "proto".
func (Codec) Name() string { return "proto" }

// Marshal encodes a response.
func (Codec) Marshal(m any) ([]byte, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a protobuf message", m)
	}
	return proto.Marshal(msg)
}

// MarshalAppend encodes a response into dst, which connect reuses across messages.
func (Codec) MarshalAppend(dst []byte, m any) ([]byte, error) {
	msg, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("marshal: %T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, msg)
}

// Unmarshal decodes a request.
func (Codec) Unmarshal(data []byte, m any) error {
	msg, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("unmarshal: %T is not a protobuf message", m)
	}
	err := proto.Unmarshal(data, msg)
	if err == nil {
		return nil
	}
	if path, found := invalidUTF8Path(data, msg.ProtoReflect().Descriptor()); found {
		return errors.New(path + ": not valid UTF-8")
	}
	return fmt.Errorf("unmarshal into %T: %w", m, err)
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
