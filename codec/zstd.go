package codec

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Zstd compresses with Zstandard at the fastest speed, the default codec for
// large values: it compresses JSON better than LZ4 or Snappy at a similar
// cost. Its payload is exactly one Zstandard frame that records the content
// size.
var Zstd Codec = zstdCodecs[0]

// ZstdDefault compresses with Zstandard at the default speed, roughly
// zstd level 3.
var ZstdDefault Codec = zstdCodecs[1]

// ZstdBetter compresses with Zstandard at the better-compression speed,
// roughly zstd level 7.
var ZstdBetter Codec = zstdCodecs[2]

// ZstdBest compresses with Zstandard at the best-compression speed, roughly
// zstd level 11, for values written rarely and read often.
var ZstdBest Codec = zstdCodecs[3]

// ZstdLevel returns the Zstandard codec nearest to the standard zstd
// compression level, 1 to 22; levels outside that range are clamped. There
// are four distinct speeds, so many levels return the same Codec. Every level
// writes the same format and any of them reads what the others wrote.
func ZstdLevel(level int) Codec {
	return zstdCodecs[zstdSpeed(level)]
}

// zstdSpeed returns the index in zstdSpeeds of the speed nearest to the
// standard zstd compression level.
func zstdSpeed(level int) int {
	l := zstd.EncoderLevelFromZstd(min(max(level, 1), 22))
	for i, s := range zstdSpeeds {
		if s == l {
			return i
		}
	}
	return len(zstdSpeeds) - 1
}

var zstdSpeeds = [4]zstd.EncoderLevel{
	zstd.SpeedFastest,
	zstd.SpeedDefault,
	zstd.SpeedBetterCompression,
	zstd.SpeedBestCompression,
}

var zstdCodecs = [4]*zstdCodec{
	{level: zstdSpeeds[0]},
	{level: zstdSpeeds[1]},
	{level: zstdSpeeds[2]},
	{level: zstdSpeeds[3]},
}

type zstdCodec struct {
	level zstd.EncoderLevel

	// dict, if not nil, makes this the codec of that dictionary at this
	// level: header byte HeaderZstdDict, frames naming the dictionary.
	dict *Dictionary

	// The encoders are made on first use, as ones for the slower levels
	// hold tens of megabytes of tables that a program that never writes
	// with them should not pay for. EncodeAll is safe for concurrent use
	// and runs on the calling goroutine, so one encoder serves every call.
	enc   zstdEncoder // every value without a dictionary; with one, values over a block
	small zstdEncoder // values of one block with a dictionary
}

type zstdEncoder struct {
	once sync.Once
	enc  *zstd.Encoder
	err  error
}

// zstdDictWindow is the window of the encoder for values of one block
// with a dictionary. An encoder with a dictionary keeps a history buffer of
// its window plus a block, even for a value of a few bytes, where without
// one it needs none: with the default window, 4 MiB at the fastest level,
// that made 5 MiB per encoder, one per GOMAXPROCS. The window need only
// reach over the value and the dictionary, 256 KiB at most, so this one
// writes the same frames (checked on 500 records at each level) and takes
// 1.3 MiB.
const zstdDictWindow = maxZstdBlock + MaxDictionarySize

// encoder returns the encoder for a value of n bytes.
func (c *zstdCodec) encoder(n int) (*zstd.Encoder, error) {
	e, window := &c.enc, 0
	if c.dict != nil && n <= maxZstdBlock {
		e, window = &c.small, zstdDictWindow
	}
	e.once.Do(func() {
		opts := []zstd.EOption{
			zstd.WithEncoderLevel(c.level),
			zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
			// The checksum costs 4 bytes and lets readers tell a
			// damaged value from a valid one.
			zstd.WithEncoderCRC(true),
			// Without it an empty input encodes to nothing, which is
			// not a frame.
			zstd.WithZeroFrames(true),
		}
		if c.dict != nil {
			opts = append(opts, zstd.WithEncoderDict(c.dict.b))
		}
		if window > 0 {
			opts = append(opts, zstd.WithWindowSize(window))
		}
		e.enc, e.err = zstd.NewWriter(nil, opts...)
	})
	return e.enc, e.err
}

func (c *zstdCodec) ID() byte {
	if c.dict != nil {
		return HeaderZstdDict
	}
	return HeaderZstd
}

func (c *zstdCodec) Name() string {
	if c.dict != nil {
		return zstdDictName
	}
	return "zstd"
}

func (c *zstdCodec) Encode(dst, src []byte) ([]byte, error) {
	enc, err := c.encoder(len(src))
	if err != nil {
		return dst, fmt.Errorf("codec %s: %w", c.Name(), err)
	}
	if len(src) == 0 && c.dict != nil {
		// The encoder writes an empty input as a frame naming no
		// dictionary, which a value of this format must not be.
		return appendZstdEmptyDictFrame(dst, c.dict.id), nil
	}
	start := len(dst)
	dst = enc.EncodeAll(src, dst)
	frame := dst[start:]
	var h zstd.Header
	if err := h.Decode(frame); err != nil {
		return dst[:start], fmt.Errorf("codec %s: encoder wrote an unreadable frame: %w", c.Name(), err)
	}
	if c.dict != nil && h.DictionaryID != c.dict.id {
		return dst[:start], fmt.Errorf("codec %s: encoder wrote a frame naming dictionary %d, not %d", c.Name(), h.DictionaryID, c.dict.id)
	}
	if !h.HasFCS {
		// The encoder leaves the size out of frames under 256 bytes that
		// are not single-segment, as the format allows. We promise it is
		// there, so turn such a frame into the single-segment form the
		// reference encoder writes for small inputs: the Window_Descriptor
		// byte goes, the Dictionary_ID after it (if any) moves up one, and
		// the byte freed at the end becomes a 1-byte Frame_Content_Size.
		// The blocks stay valid, as a frame that small has no offset
		// reaching past its start but into the dictionary, which a
		// single-segment frame reaches as well.
		did := zstdDictIDSize(frame[4])
		if len(src) >= 256 || h.SingleSegment || frame[4]>>6 != 0 || h.HeaderSize != 6+did {
			return dst[:start], fmt.Errorf("codec %s: encoder wrote a frame without its content size", c.Name())
		}
		frame[4] |= 1 << 5 // Single_Segment_Flag
		copy(frame[5:], frame[6:6+did])
		frame[5+did] = byte(len(src))
	}
	return dst, nil
}

func (c *zstdCodec) Decode(dst, src []byte, limit int) ([]byte, error) {
	if c.dict != nil {
		return decodeZstdDict(dst, src, limit, c.dict)
	}
	return decodeZstd(dst, src, limit)
}

// zstdDictIDSize returns the size of the Dictionary_ID field that the
// Frame_Header_Descriptor fhd declares (RFC 8878, section 3.1.1.1.1).
func zstdDictIDSize(fhd byte) int {
	return [4]int{0, 1, 2, 4}[fhd&3]
}

const (
	// zstdOverAlloc is the spare capacity klauspost/compress's decoder
	// wants past the end of its output (compressedBlockOverAlloc there).
	// With less than the block being decoded plus this, its assembly
	// sequence decoder switches to bounds-exact copies: decoding into a
	// buffer of exactly the frame's size measured 15% slower on a one-block
	// frame of 128 KiB, 7% on one of 235 KiB, than with this slack.
	zstdOverAlloc = 32

	// maxZstdBlock is the most one block may hold, compressed or not
	// (RFC 8878, section 3.1.1.2.4, Block_Maximum_Size).
	maxZstdBlock = 128 << 10

	// maxZstdWindow is the largest window the reference decoder accepts
	// on 64-bit platforms (ZSTD_WINDOWLOG_MAX_64). Frames declaring more
	// are refused as corrupt, so that no value decodes here that the
	// reference cannot read. It is not what bounds memory: see
	// decodeZstdStream.
	maxZstdWindow = 1 << 31
)

// zstdAll decodes frames that record their size. DecodeAll is safe for
// concurrent use and, with WithDecodeAllCapLimit, refuses a frame whose
// recorded size exceeds the capacity it is given (the recorded size plus
// zstdOverAlloc) and stops when that is full. It keeps no window of its
// own, so the window a frame declares costs nothing here.
//
// Neither WithDecodeAllCapLimit nor WithDecoderLowmem costs time: each
// measured within 1% of a plain zstd.NewReader(nil) on BenchmarkZstdFloor's
// frames. Lowmem is the library's default; it keeps each of the
// GOMAXPROCS block decoders to the literal buffer its largest block needs
// rather than 128 KiB (measured: about 180 KiB retained per block decoder
// with it, 300 KiB without). Concurrent DecodeAll calls beyond GOMAXPROCS
// wait for a block decoder, so this memory does not grow with them.
var zstdAll struct {
	once sync.Once
	dec  *zstd.Decoder
	err  error
}

func zstdAllDecoder() (*zstd.Decoder, error) {
	zstdAll.once.Do(func() {
		zstdAll.dec, zstdAll.err = newZstdAllDecoder()
	})
	return zstdAll.dec, zstdAll.err
}

// newZstdAllDecoder returns a decoder for DecodeAll as zstdAll describes,
// with opts, such as a dictionary, added.
func newZstdAllDecoder(opts ...zstd.DOption) (*zstd.Decoder, error) {
	return zstd.NewReader(nil, append([]zstd.DOption{
		zstd.WithDecoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithDecodeAllCapLimit(true),
		zstd.WithDecoderMaxWindow(maxZstdWindow),
		zstd.WithDecoderLowmem(true),
	}, opts...)...)
}

// zstdStreams holds decoders for frames that do not record their size,
// which must be decoded as a stream to stop at the limit: DecodeAll with a
// memory limit was measured to allocate several times the limit before
// failing on such a frame. Concurrency 1 makes a decoder synchronous, so no
// goroutine outlives a call and an unused decoder needs no Close.
var zstdStreams sync.Pool // *zstdStream

type zstdStream struct {
	dec  *zstd.Decoder
	head [18]byte // the largest frame header: magic, descriptor, window, dictionary ID, size
	r    HeadReader
}

// maxPooledZstdWindow is the largest window whose decoder goes back to the
// pool: a decoder keeps its window buffer, and a rare huge value should not
// pin that much memory for every later small one.
const maxPooledZstdWindow = 8 << 20

func decodeZstd(dst, src []byte, limit int) ([]byte, error) {
	limit = clampLimit(limit)
	h, most, err := zstdFrame(src, "zstd")
	if err != nil {
		return dst, err
	}
	if h.DictionaryID != 0 {
		return dst, corruptf("zstd", "frame needs dictionary %d", h.DictionaryID)
	}
	if !h.HasFCS {
		return decodeZstdStream(dst, src, limit, &h, most)
	}
	if err := zstdCheckSize(&h, most, limit, "zstd"); err != nil {
		return dst, err
	}
	dec, err := zstdAllDecoder()
	if err != nil {
		return dst, fmt.Errorf("codec zstd: %w", err)
	}
	return decodeZstdAll(dst, src, dec, &h, "zstd")
}

// zstdFrame reads the header of the one frame src must be and walks its
// blocks, checking everything that can be checked without decoding it. It
// returns the header and the most the frame can decode to, which nothing
// larger is ever allocated for, however large the limit.
func zstdFrame(src []byte, name string) (h zstd.Header, most uint64, err error) {
	if err := h.Decode(src); err != nil {
		if err == io.ErrUnexpectedEOF {
			return h, 0, corruptf(name, "truncated frame header")
		}
		return h, 0, corruptErr(name, err)
	}
	if h.Skippable {
		return h, 0, corruptf(name, "skippable frame instead of a Zstandard frame")
	}
	if !h.SingleSegment && h.WindowSize > maxZstdWindow {
		return h, 0, corruptf(name, "window of %d bytes, over the %d the reference decoder accepts", h.WindowSize, maxZstdWindow)
	}
	frameLen, blocks, err := zstdFrameLen(src, h.HeaderSize, h.HasCheckSum, name)
	if err != nil {
		return h, 0, err
	}
	if frameLen != len(src) {
		return h, 0, corruptf(name, "%d bytes after the frame", len(src)-frameLen)
	}
	return h, uint64(blocks) * maxZstdBlock, nil
}

// zstdCheckSize refuses, before anything is allocated for it, a frame whose
// recorded size is over limit or more than its blocks can hold.
func zstdCheckSize(h *zstd.Header, most uint64, limit int, name string) error {
	size := h.FrameContentSize
	if size > uint64(limit) {
		return tooLargef(name, size, limit)
	}
	if size > most {
		return corruptf(name, "frame of %d blocks cannot hold %d bytes", most/maxZstdBlock, size)
	}
	return nil
}

// decodeZstdAll appends to dst what src, a frame that zstdCheckSize passed,
// decodes to with dec.
func decodeZstdAll(dst, src []byte, dec *zstd.Decoder, h *zstd.Header, name string) ([]byte, error) {
	start, n := len(dst), int(h.FrameContentSize)
	if cap(dst)-start < n {
		// With the slack, so that this buffer, reused, decodes the
		// next value of this size at full speed too.
		grown := make([]byte, start, start+n+zstdOverAlloc)
		copy(grown, dst)
		dst = grown
	}
	// The decoder gets the recorded size plus up to zstdOverAlloc bytes
	// of dst's spare capacity, where it may write scratch past what it
	// returns. A dst with room for the value but not the slack is used as
	// it is, at the cost of slower copies in the last block, rather than
	// reallocated. A frame holding more than it says may fill the slack,
	// and is refused below for not decoding to its size.
	room := min(cap(dst), start+n+zstdOverAlloc)
	// Decoding into an empty slice, not after dst's contents, keeps those
	// bytes out of the frame's history: a match may only reach back into
	// this frame's own output (and its dictionary).
	out, err := dec.DecodeAll(src, dst[start:start:room])
	if err != nil {
		// The size is within the limit, so a frame that does not
		// decode to it is corrupt, including one that holds more than
		// it says and so runs out of room.
		return dst[:start], corruptErr(name, err)
	}
	if len(out) != n {
		return dst[:start], corruptf(name, "frame decoded to %d bytes, header says %d", len(out), n)
	}
	if n > 0 && &out[0] != &dst[start : start+1][0] {
		// Not expected with the capacity limit, but never worth a wrong
		// answer.
		copy(dst[start:start+n], out)
	}
	return dst[:start+n], nil
}

func decodeZstdStream(dst, src []byte, limit int, h *zstd.Header, most uint64) ([]byte, error) {
	s, _ := zstdStreams.Get().(*zstdStream)
	if s == nil {
		dec, err := zstd.NewReader(nil,
			zstd.WithDecoderConcurrency(1),
			zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxWindow(maxZstdWindow),
			zstd.WithDecodeBuffersBelow(0),
		)
		if err != nil {
			return dst, fmt.Errorf("codec zstd: %w", err)
		}
		s = &zstdStream{dec: dec}
	}

	// The decoder allocates the declared window before the first block,
	// and a frame may declare up to 2 GiB. The window only has to reach
	// back over what the frame can produce before we stop reading it: the
	// limit plus the block that crosses it, and never more than its blocks
	// can hold. An offset reaching farther is invalid in such a frame
	// whatever window it declares, so decoding with the window shrunk to
	// that reach yields exactly the same bytes, or the same refusal. The
	// Window_Descriptor of a frame without a content size is always byte 5:
	// such a frame cannot be single-segment.
	n := copy(s.head[:], src[:h.HeaderSize])
	window := h.WindowSize
	if need := max(min(uint64(limit)+maxZstdBlock, most), zstd.MinWindowSize); window > need {
		wd := zstdWindowDescriptor(need)
		s.head[5] = wd
		window = zstdWindowSize(wd)
	}
	s.r = HeadReader{Head: s.head[:n], Rest: src[h.HeaderSize:]}

	var err error
	if err = s.dec.Reset(&s.r); err == nil {
		hint := int(min(most, uint64(8*len(src))))
		dst, err = readLimited(dst, s.dec, limit, hint)
	}
	// Drop the references to src before pooling.
	_ = s.dec.Reset(nil)
	s.r = HeadReader{}
	if window <= maxPooledZstdWindow {
		zstdStreams.Put(s)
	}
	if err != nil {
		if err == errOverLimit {
			return dst, fmt.Errorf("codec zstd: %w: frame without content size decodes to more than %d bytes", ErrTooLarge, limit)
		}
		return dst, zstdErr(err)
	}
	return dst, nil
}

// zstdErr maps an error from the decoder onto ErrTooLarge or ErrCorrupt,
// keeping the decoder's error for the message.
func zstdErr(err error) error {
	if errors.Is(err, zstd.ErrDecoderSizeExceeded) {
		return fmt.Errorf("codec zstd: %w: %w", ErrTooLarge, err)
	}
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		return corruptf("zstd", "truncated frame")
	}
	return corruptErr("zstd", err)
}

// zstdFrameLen walks the block headers of the frame whose header takes the
// first hdrLen bytes of src, and returns where the frame ends and how many
// blocks it has. It reads no block's content, so it is cheap, and it lets
// the decoders see exactly one frame: a payload is one frame, and bytes
// after it would otherwise be decoded as more frames.
func zstdFrameLen(src []byte, hdrLen int, checksum bool, name string) (end, blocks int, err error) {
	pos := hdrLen
	for {
		if len(src)-pos < 3 {
			return 0, 0, corruptf(name, "truncated frame")
		}
		bh := uint32(src[pos]) | uint32(src[pos+1])<<8 | uint32(src[pos+2])<<16
		pos += 3
		size := int(bh >> 3)
		if size > maxZstdBlock {
			return 0, 0, corruptf(name, "block of %d bytes", size)
		}
		switch bh >> 1 & 3 {
		case 0, 2: // Raw_Block, Compressed_Block
		case 1: // RLE_Block: one byte repeated size times
			size = 1
		default:
			return 0, 0, corruptf(name, "reserved block type")
		}
		if len(src)-pos < size {
			return 0, 0, corruptf(name, "truncated frame")
		}
		pos += size
		blocks++
		if bh&1 != 0 {
			break
		}
	}
	if checksum {
		if len(src)-pos < 4 {
			return 0, 0, corruptf(name, "truncated frame")
		}
		pos += 4
	}
	return pos, blocks, nil
}

// zstdWindowDescriptor returns the smallest Window_Descriptor (RFC 8878,
// section 3.1.1.1.2) whose window is at least size. size must not exceed
// the largest such window, which every caller's bound ensures.
func zstdWindowDescriptor(size uint64) byte {
	for exp := range 32 {
		for mant := range 8 {
			wd := byte(exp<<3 | mant)
			if zstdWindowSize(wd) >= size {
				return wd
			}
		}
	}
	return 0xFF
}

func zstdWindowSize(wd byte) uint64 {
	base := uint64(1) << (10 + wd>>3)
	return base + base/8*uint64(wd&7)
}
