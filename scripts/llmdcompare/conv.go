package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
)

// message is one chat message.
type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// chatRequest is the OpenAI chat body sent for one turn.
type chatRequest struct {
	Model     string    `json:"model"`
	Messages  []message `json:"messages"`
	MaxTokens int       `json:"max_tokens"`
	Stream    bool      `json:"stream"`
}

// workload is the shape of the conversations: multi-turn coding-agent
// sessions that share one system prompt and resend their growing history
// every turn (the assistant's answers and the tools' outputs appended).
type workload struct {
	seed         uint64
	model        string
	sessions     int
	turns        int
	systemBytes  int // the shared system prompt
	taskBytes    int // each session's first user message
	toolMinBytes int // each later turn's user message (a tool's output), uniform in [min, max]
	toolMaxBytes int
	maxTokens    int // the answer's length
}

// conversation is one session's history.
type conversation struct {
	id   string
	rng  *rand.Rand
	msgs []message
}

// vocabulary of the generated text (a coding agent's words).
var vocabulary = strings.Fields(`the a file function test error return value module package import
build run check read write edit patch diff line branch commit merge config option flag path handler
request response server client cache block prefix token replica router session turn prompt answer
index queue score weight metric gauge scrape picker endpoint pod model engine step batch limit
timeout retry close open parse decode encode buffer slice map struct field method interface`)

// text returns n bytes of words drawn from rng, in lines.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	col := 0
	for b.Len() < n {
		w := vocabulary[rng.IntN(len(vocabulary))]
		if col > 0 {
			if col+len(w) > 72 {
				b.WriteByte('\n')
				col = 0
			} else {
				b.WriteByte(' ')
				col++
			}
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()[:n]
}

// systemPrompt is the prompt every session starts with.
func (w workload) systemPrompt() string {
	rng := rand.New(rand.NewPCG(w.seed, 0x5157))
	return "You are a careful coding agent. Follow these rules.\n" + text(rng, w.systemBytes)
}

// conversations returns the sessions, each with its system prompt and
// first user message.
func (w workload) conversations() []*conversation {
	sys := w.systemPrompt()
	out := make([]*conversation, w.sessions)
	for s := range out {
		rng := rand.New(rand.NewPCG(w.seed, uint64(s)+1))
		out[s] = &conversation{
			id:  fmt.Sprintf("session-%02d", s),
			rng: rng,
			msgs: []message{
				{Role: "system", Content: sys},
				{Role: "user", Content: fmt.Sprintf("Task %d: ", s) + text(rng, w.taskBytes)},
			},
		}
	}
	return out
}

// body is the request of the conversation's next turn.
func (w workload) body(c *conversation) []byte {
	b, err := json.Marshal(chatRequest{Model: w.model, Messages: c.msgs, MaxTokens: w.maxTokens})
	if err != nil {
		panic(err) // strings only: cannot fail
	}
	return b
}

// advance appends the answer and the next tool output to c.
func (w workload) advance(c *conversation, answer string) {
	n := w.toolMinBytes + c.rng.IntN(w.toolMaxBytes-w.toolMinBytes+1)
	c.msgs = append(c.msgs, message{Role: "assistant", Content: answer},
		message{Role: "user", Content: "Tool output:\n" + text(c.rng, n)})
}

// answerText is the assistant's text in an OpenAI chat completion.
func answerText(body []byte) (string, error) {
	var v struct {
		Choices []struct {
			Message message `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return "", fmt.Errorf("the answer is not a chat completion: %w", err)
	}
	if len(v.Choices) == 0 {
		return "", fmt.Errorf("the answer has no choices: %.200s", body)
	}
	return v.Choices[0].Message.Content, nil
}

// parseChat reads a chat request body.
func parseChat(body []byte) (chatRequest, error) {
	var cr chatRequest
	err := json.Unmarshal(body, &cr)
	return cr, err
}
