package codec

// None stores payloads uncompressed behind header byte 0x01. Writers use it
// for payloads that cannot be stored verbatim: empty ones, ones whose first
// byte is a header byte, and the output of binary serializers.
var None Codec = noneCodec{}

type noneCodec struct{}

func (noneCodec) ID() byte     { return HeaderNone }
func (noneCodec) Name() string { return "none" }

func (noneCodec) Encode(dst, src []byte) ([]byte, error) {
	return append(dst, src...), nil
}

func (noneCodec) Decode(dst, src []byte, limit int) ([]byte, error) {
	if len(src) > clampLimit(limit) {
		return dst, tooLargef("none", uint64(len(src)), limit)
	}
	return append(dst, src...), nil
}
